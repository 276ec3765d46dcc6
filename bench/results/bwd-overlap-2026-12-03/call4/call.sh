#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]: the change as committed. Binaries:
#   prev = e1c8012 (main before this work); cs = 2bd07e3 (call 2's best, Q and dO by cp.async
#   at every head dim); new = .dev/ (build_gpu_tests.sh): Q and dO by TMA in padded tiles (80,
#   96) only; its d128 and d64 kernels are cs's SASS (cuobjdump, only the dQ map's parameter
#   offset differs).
# (Cut to fit the session's last device time.)
# 1. gpu_attention (new): the oracle checks of the whole-sequence path (every head dim, masks,
#    GQA/MQA, odd lengths) and of the lent-memory path with the default kernels; the first with
#    the deterministic backward;
# 2. gpu_timing attention at 32K: prev / cs / new, d80 and d96; new at d64 and d128 as a check;
#    the deterministic backward at d128 and d96, prev against new.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches lent_memory > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_default.log | tail -n 6
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=100 bash bench/peers/gpu_tests.sh fast_path_matches > /dev/null 2>&1; echo "gpu_attention det fast_path: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_det.log | tail -n 3
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
bin() { case $1 in new) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1; do
  for v in prev cs new; do
    timeout 60 $(bin $v) attention --seqs 32768 --head-dims 80,96 --json $R/p_${v}_$round.jsonl > /dev/null 2>&1
    echo "d80/96 $v round $round: exit $? $(sum $R/p_${v}_$round.jsonl)"
  done
done
timeout 60 .dev/gpu_timing attention --seqs 32768 --head-dims 64,128 --json $R/check_new.jsonl > /dev/null 2>&1
echo "d64/128 new: exit $? $(sum $R/check_new.jsonl)"
for v in prev new; do
  DISTFLASH_TUNING=deterministic=true timeout 60 $(bin $v) attention --seqs 32768 --head-dims 96,128 --json $R/det_$v.jsonl > /dev/null 2>&1
  echo "deterministic $v: exit $? $(sum $R/det_$v.jsonl)"
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

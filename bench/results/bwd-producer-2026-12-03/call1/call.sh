#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Builds:
#   v20 = .dev/v20/gpu_timing (main 2d629c1, kernels v20)
#   ws  = .dev/ (build_gpu_tests.sh of this change): the wgmma backward with a third
#         warpgroup (setmaxnreg 24/240) whose first warp loads Q, dO (TMA), LSE, D and row
#         starts (cp.async onto the stage's mbarrier) and whose second issues dQ's TMA
#         reductions; full/empty mbarriers per stage, named barriers for the dQ hand-off, two
#         dSᵀ buffers, no CTA barrier in the tile loop.
# 1. a first timing of ws alone (a hang shows as exit 124 here, not in the tests);
# 2. gpu_attention (ws): default kernels; deterministic oracle and repeat checks;
# 3. gpu_timing attention, v20 / ws alternated twice: d128 4K, 8K, 16K, 32K, 128K; d64 8K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in ws) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
timeout 40 .dev/gpu_timing attention --seqs 32768 --head-dims 128 --json $R/first.jsonl > $R/first.out 2>&1; echo "first ws d128 32K: exit $? $(sum $R/first.jsonl)"; tail -n 3 $R/first.out
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_default.log | tail -n 8
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=100 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_det.log | tail -n 4
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for round in 1 2; do
  for v in v20 ws; do
    timeout 60 $(tbin $v) attention --seqs 4096,8192,16384,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 30 $(tbin $v) attention --seqs 8192 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

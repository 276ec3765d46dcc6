#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]. Binaries:
#   prev = e1c8012 (main before this work)
#   cs   = 2bd07e3 (dQ by TMA reductions, Sᵀ/dPᵀ split: call 2's best)
#   t    = .dev/ (build_gpu_tests.sh of this change): cs with Q and dO loaded by TMA from one
#          thread on a barrier per stage, instead of 16 cp.async per thread per tile
# 1. gpu_attention (t): everything with the default kernels; the oracle checks with the
#    deterministic backward;
# 2. gpu_timing attention, prev / cs / t alternated twice: d128 at 8K, 32K, 128K; d64, d96 at 32K;
# 3. t beside SDPA (cuDNN, FlashAttention-2) in this call: d64, 96, 128 at 8K and 32K, d128 at 128K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_default.log | tail -n 6
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=120 bash bench/peers/gpu_tests.sh fast_path_matches > /dev/null 2>&1; echo "gpu_attention det fast_path: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_det.log | tail -n 3
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
bin() { case $1 in t) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in prev cs t; do
    timeout 100 $(bin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 60 $(bin $v) attention --seqs 32768 --head-dims 64,96 --json $R/s_${v}_$round.jsonl > /dev/null 2>&1
    echo "d64/96 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
mkdir -p $R/peer
timeout 90 .dev/distflash bench attention --device cuda --seqs 8192,32768 --head-dims 64,96,128 --json $R/peer/ours.jsonl > $R/peer/ours.out 2>&1; echo "ours exit $?"
timeout 90 .dev/distflash bench attention --device cuda --seqs 131072 --head-dims 128 --json $R/peer/ours_128k.jsonl > $R/peer/ours128k.out 2>&1; echo "ours 128K exit $?"
timeout 150 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 64,96,128 --json $R/peer/sdpa.jsonl > $R/peer/sdpa.out 2>&1; echo "sdpa exit $?"
timeout 120 python3 bench/peers/sdpa_bench.py --seqs 131072 --head-dims 128 --json $R/peer/sdpa_128k.jsonl > $R/peer/sdpa128k.out 2>&1; echo "sdpa 128K exit $?"
.dev/distflash bench report --results $R/peer --out $R/peer/RESULTS.md && tail -n 14 $R/peer/RESULTS.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Builds:
#   v31 = .dev/v31/ (main ceab480; gpu_timing only)
#   v34 = .dev/     v31 plus: the forward's O leaves fwd_final through shared memory at head dims
#                   128, 192 and 256 (O_STAGED in forward_wgmma.cu: staged over the warpgroup's
#                   rows of Q's tile, then 16-byte vectors along whole rows), v32's change
#                   (bench/results/short-bwd-2026-12-04/call4) kept where it measured a gain;
#                   64, 80 and 96 store their pairs as before. Call 1's v33 is not in it.
# Prediction, written before the call: the forward +1-2% at 8K for d128, d192 and d256 (call 4
# of short-bwd-2026-12-04: +1.7%, +1-2%), level from 32K; d64 level (unchanged code); the
# backward level everywhere.
# 1. every GPU test on v34: gpu_attention (every case, every head dim: the forward's O staged at
#    128 and over), gpu_model_attention, gpu_ops;
# 2. gpu_timing attention v31 / v34 alternated twice: d128 at 8K, 16K, 32K, 128K; d64, d192,
#    d256 at 8K and 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
LOG=$R/gpu_attention.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention (v34): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention.log | tail -n 3
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (v34): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
for round in 1 2; do
  for v in v31 v34; do
    b=.dev/gpu_timing; [ $v = v31 ] && b=.dev/v31/gpu_timing
    timeout 100 $b attention --seqs 8192,16384,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $b attention --seqs 8192,32768 --head-dims 64,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

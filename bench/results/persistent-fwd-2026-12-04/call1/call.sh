#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. NOT RUN YET: no device was lent on 2026-12-04
# after this was written (see ../README.md for how to build the two builds and run it).
# Builds:
#   base = .dev/base/ (main 5cfe154, kernels v34; gpu_timing only)
#   v35  = .dev/      v34 plus: the wgmma forward's CTAs are persistent, one per SM, taking
#                     works (a batch·head's 128-row query tile) from an atomic counter, heaviest
#                     first; two Q buffers up to head dim 192 (one at 256), so that the next
#                     work's Q and first K and V tiles load under the current work's last tiles.
#                     The forward's O leaves through staged_rows_out (wgmma.cuh), as the
#                     backward's dK and dV do on main.
# Prediction, written before the call (both timers load ~1 s before timing, WARM_MS): the d128
# forward +2-4% at 4K and 8K, +1-2% at 16K, 0-1% from 32K; d64 +3-5% at 8K; d192 +1-3% at 8K;
# d256 (one Q buffer: its Q's latency stays) 0-2% at 8K; the backward level (unchanged code).
# 1. every GPU test on v35 (gpu_attention: every head dim, masks, GQA/MQA, odd lengths, blocks'
#    fwd_state; gpu_model_attention; gpu_ops);
# 2. gpu_timing attention base / v35 alternated twice: d128 at 4K, 8K, 16K, 32K, 128K; d64, d192,
#    d256 at 8K and 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
LOG=$R/gpu_attention.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention (v35): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention.log | tail -n 3
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (v35): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
for round in 1 2; do
  for v in base v35; do
    b=.dev/gpu_timing; [ $v = base ] && b=.dev/base/gpu_timing
    timeout 120 $b attention --seqs 4096,8192,16384,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $b attention --seqs 8192,32768 --head-dims 64,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

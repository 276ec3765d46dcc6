#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. NOT RUN YET: no device was lent on 2026-12-04
# after this was written (see ../README.md for how to build the two builds and run it).
# Builds:
#   base = .dev/base/ (main from 5cfe154 on, kernels v34; gpu_timing only)
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
LOG=$R/gpu_tests.log TIMEOUT=240 bash bench/peers/gpu_tests.sh; echo "gpu tests (v35): exit $?"
grep -h "test result\|panicked" $R/gpu_tests.log | tail -n 6
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 200 > $R/clocks.csv &
SMI=$!
bash bench/peers/ab_attention.sh .dev/base .dev 2 4096,8192,16384,32768,131072:128 8192,32768:64,192,256
kill $SMI
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

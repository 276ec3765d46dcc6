#!/usr/bin/env bash
# Device call 7 (nvidia-h200), carry [".dev"]: .dev/ after the review. The forward kernels take
# their heaviest-first order from cta_work's DESCENDING instead of reversing the tile themselves,
# and with_tuning applies a variant's `deterministic` (DISTFLASH_TUNING=deterministic=true now
# reaches the backend through with_tuning alone). gpu_attention with every backend
# deterministic, then the default kernels' fast path.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention det: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|Error\|error:" $R/gpu_attention_det.log | tail -n 8
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_attention_fast.log TESTS=gpu_attention TIMEOUT=60 bash bench/peers/gpu_tests.sh fast_path > /dev/null 2>&1; echo "gpu_attention fast_path default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked" $R/gpu_attention_fast.log | tail -n 4

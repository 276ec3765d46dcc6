#!/usr/bin/env bash
# Device call (nvidia-h200) after wg_rs_n's four asm blocks became one macro (kernels/wgmma.cuh;
# the same instruction text), binaries by build_gpu_tests.sh, carry [".dev"]: gpu_attention's
# whole-sequence and deterministic tests, then head dims 80, 96 and 128 at 8K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh fast_path_matches
TESTS=gpu_attention TIMEOUT=200 LOG=$OUT/gpu_tests_det.log bash bench/peers/gpu_tests.sh the_deterministic_backward
grep -h "passed: worst\|same bits\|differ\|FAILED\|panicked" $OUT/gpu_tests.log $OUT/gpu_tests_det.log
timeout 60 .dev/distflash bench attention --device cuda --seqs 8192 --head-dims 80,96,128 --json $OUT/ours.jsonl 2>&1 | tail -n 6

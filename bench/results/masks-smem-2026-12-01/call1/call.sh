#!/usr/bin/env bash
# Device call (nvidia-h200): the masked backward with row starts staged in shared memory
# (issue 19) — GPU attention tests on both kernel families, then the 128K timing against the
# ideal and FlexAttention; binaries from bench/peers/build_gpu_tests.sh, carry [".dev"].
set -u
export PATH=/opt/torch/.venv/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
LOG=$OUT/gpu_tests.log TESTS="gpu_attention gpu_model_attention" timeout 200 bash bench/peers/gpu_tests.sh; echo "wgmma tests exit $?"
grep -E "test result|FAILED|panicked" $OUT/gpu_tests.log | head -8
LOG=$OUT/gpu_tests_mma_sync.log DISTFLASH_TUNING=fwd-wgmma=false,bwd-wgmma=false TESTS="gpu_attention" timeout 120 bash bench/peers/gpu_tests.sh; echo "mma.sync tests exit $?"
grep -E "test result|FAILED|panicked" $OUT/gpu_tests_mma_sync.log | head -8
MASK_PART=timing BIN=.dev/distflash timeout 260 bash bench/peers/mask_bench.sh > $OUT/mask_timing.out 2>&1
echo "mask timing exit $?"; tail -n 14 $OUT/mask_timing.out

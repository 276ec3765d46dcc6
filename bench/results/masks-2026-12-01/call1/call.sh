#!/usr/bin/env bash
# Device call (nvidia-h200): masks in the CUDA kernels (issue 19), correctness; binaries built by
# bench/peers/build_gpu_tests.sh at the commit in the README, carry [".dev"].
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
bash bench/peers/gpu_tests.sh
LOG=$OUT/gpu_tests_mma_sync.log DISTFLASH_TUNING=fwd-wgmma=false,bwd-wgmma=false TESTS="gpu_attention gpu_model_attention" bash bench/peers/gpu_tests.sh
mkdir -p $OUT/parity
OUT=$OUT/parity BIN_DIR=.dev CASES="mistral_window16:cpu mistral_window16:cuda" bash bench/peers/config_parity.sh | tail -n 4
MASK_PART=checks BIN=.dev/distflash bash bench/peers/mask_bench.sh > $OUT/mask_checks.out 2>&1; echo "mask checks exit $?"
grep -h '"pass"' $OUT/torch_checks.jsonl | head -5
.dev/distflash bench attention --device cuda --seqs 16384,65536 --head-dims 128,64 --json $OUT/causal.jsonl > $OUT/causal.out 2>&1
grep -o '"fwd_tflops":[0-9.]*\|"bwd_tflops":[0-9.]*\|"seq":[0-9]*\|"head_dim":[0-9]*' $OUT/causal.jsonl | paste -sd' '
cd $OUT && tar czf parity.tgz parity && rm -rf parity

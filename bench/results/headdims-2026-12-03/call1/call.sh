#!/usr/bin/env bash
# Device call (nvidia-h200), binaries built by bench/peers/build_gpu_tests.sh into .dev/, carry [".dev"]:
#   1. gpu_attention with the default kernels (80 and 96 now on wgmma in tiles of 128), then
#      with the mma.sync kernels forced (fwd-wgmma=false,bwd-wgmma=false,fwd-mtiles=1), which
#      80 and 96 keep on other GPUs
#   2. head dims at 8K and 32K: ours beside SDPA's cuDNN and FlashAttention-2, and the table
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $OUT/gpu.txt
TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh
DISTFLASH_TUNING=fwd-wgmma=false,bwd-wgmma=false,fwd-mtiles=1 LOG=$OUT/gpu_tests_mma_sync.log \
  TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches
grep -h "passed: worst\|FAILED\|panicked" $OUT/gpu_tests.log $OUT/gpu_tests_mma_sync.log | head -20
mkdir -p $OUT/runs/hd
timeout 90 .dev/distflash bench attention --device cuda --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $OUT/runs/hd/ours.jsonl > $OUT/runs/hd/ours.out 2>&1
echo "ours exit $?"
timeout 150 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $OUT/runs/hd/sdpa.jsonl > $OUT/runs/hd/sdpa.out 2>&1
echo "sdpa exit $?"
.dev/distflash bench report --results $OUT/runs/hd --out $OUT/runs/hd/RESULTS.md && tail -n 18 $OUT/runs/hd/RESULTS.md

#!/usr/bin/env bash
# Device call (nvidia-h200), binaries of the merged tree (0aecd56) built by build_gpu_tests.sh,
# and .dev/distflash-old of 3ed9a15 (main before the masks and head dims merged), carry [".dev"]:
#   1. gpu_attention: every head dim (64, 80, 96, 128, 192, 256) and the masks against the f64
#      oracle (whole sequence, lent memory, block API)
#   2. causal speed before and after the merges, one run: bench attention 16K/64K, d128/d64
#   3. masks at 128K beside FlexAttention (mask_bench.sh's timing half)
#   4. head dims at 8K: ours beside SDPA's cuDNN and FlashAttention-2
set -u
export PATH=/opt/torch/.venv/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh
grep -h "passed: worst" $OUT/gpu_tests.log
for b in distflash-old distflash; do
  timeout 60 .dev/$b bench attention --device cuda --seqs 16384,65536 --head-dims 128,64 --json $OUT/causal_$b.jsonl > /dev/null 2>&1
  echo "$b: $(grep -o '"fwd_tflops":[0-9.]*\|"bwd_tflops":[0-9.]*' $OUT/causal_$b.jsonl | cut -d: -f2 | cut -c1-5 | paste -sd' ')"
done
MASK_PART=timing BIN=.dev/distflash timeout 170 bash bench/peers/mask_bench.sh > $OUT/mask_timing.out 2>&1
echo "mask timing exit $?"; tail -n 12 $OUT/mask_timing.out
mkdir -p $OUT/hd
timeout 50 .dev/distflash bench attention --device cuda --seqs 8192 --head-dims 64,80,96,128,192,256 --heads 32 --json $OUT/hd/distflash.jsonl > /dev/null 2>&1
timeout 80 python3 bench/peers/sdpa_bench.py --seqs 8192 --head-dims 64,80,96,128,192,256 --heads 32 --json $OUT/hd/sdpa.jsonl > $OUT/hd/sdpa.out 2>&1
.dev/distflash bench report --results $OUT/hd --out $OUT/hd/RESULTS.md && cat $OUT/hd/RESULTS.md | tail -n 20
cd $OUT && tar czf hd.tgz hd && rm -rf hd

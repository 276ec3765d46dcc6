#!/usr/bin/env bash
# Device call (nvidia-h200): the causal module compiled without the mask (MASKED 0) against
# main before the masks (.dev/distflash-old, 3ed9a15) in one run; gpu_attention over both
# modules; masks at 128K beside FlexAttention. Binaries built by build_gpu_tests.sh, carry [".dev"].
set -u
export PATH=/opt/torch/.venv/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
for b in distflash-old distflash distflash-old distflash; do
  timeout 60 .dev/$b bench attention --device cuda --seqs 16384,65536 --head-dims 128,64 --json $OUT/c.jsonl > /dev/null 2>&1
  cat $OUT/c.jsonl >> $OUT/causal_$b.jsonl
  echo "$b (bwd fwd TFLOP/s; d128 16K, d128 64K, d64 16K, d64 64K): $(grep -o '"fwd_tflops":[0-9.]*\|"bwd_tflops":[0-9.]*' $OUT/c.jsonl | cut -d: -f2 | cut -c1-5 | paste -sd' ')"
done
rm -f $OUT/c.jsonl
TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh
grep -h "passed: worst" $OUT/gpu_tests.log
MASK_PART=timing BIN=.dev/distflash timeout 200 bash bench/peers/mask_bench.sh > $OUT/mask_timing.out 2>&1
echo "mask timing exit $?"; tail -n 14 $OUT/mask_timing.out

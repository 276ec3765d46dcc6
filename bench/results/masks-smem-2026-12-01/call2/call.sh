#!/usr/bin/env bash
# Device call (nvidia-h200): the wgmma backward's mask test as a pass of its own (issue 19) —
# GPU attention tests, the masked module on a nearly causal mask against the causal one (16K,
# window 16383), then the 128K timing against the ideal and FlexAttention. Binaries of the
# commit in the README from bench/peers/build_gpu_tests.sh, carry [".dev"].
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
LOG=$OUT/gpu_tests.log TESTS="gpu_attention gpu_model_attention" timeout 200 bash bench/peers/gpu_tests.sh; echo "wgmma tests exit $?"
grep -E "test result|FAILED|panicked" $OUT/gpu_tests.log | head -8
for w in none 16383; do
  args=(); [ "$w" = none ] || args=(--window "$w")
  .dev/distflash bench attention --device cuda --seqs 16384 --head-dims 128 "${args[@]}" --json $OUT/window_$w.jsonl > /dev/null 2>&1
  grep -o '"fwd_ms":[0-9.]*\|"bwd_ms":[0-9.]*\|"mask":"[^"]*"' $OUT/window_$w.jsonl | paste -sd' '
done
MASK_PART=timing BIN=.dev/distflash timeout 260 bash bench/peers/mask_bench.sh > $OUT/mask_timing.out 2>&1
echo "mask timing exit $?"; grep -o '"mask": "[^"]*"\|"fwd_over_ideal": [0-9.]*\|"fwdbwd_over_ideal": [0-9.]*\|"fwdbwd_ms": [0-9.]*' $OUT/mask_bench.json | paste -sd' '

#!/usr/bin/env bash
# Device call (nvidia-h200): llama2-7b with AdamW at 256K tokens on one H200 (issue 17), under
# --checkpoint layer --offload all (no --save-dir: no final host copy of the weights); first the
# masked module's cost on a nearly causal mask (issue 19: a window of 16383 at 16K against
# causal, same binary). Binaries of c7ae6d1 from bench/peers/build_gpu_tests.sh, carry [".dev"].
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache-offload
for w in none 16383; do
  args=(); [ "$w" = none ] || args=(--window "$w")
  .dev/distflash bench attention --device cuda --seqs 16384 --head-dims 128 "${args[@]}" --json $OUT/window_$w.jsonl > /dev/null 2>&1
  grep -o '"fwd_ms":[0-9.]*\|"bwd_ms":[0-9.]*\|"mask":"[^"]*"' $OUT/window_$w.jsonl | paste -sd' '
done
SECTIONS=256k TRAIN_TIMEOUT=480 bash bench/peers/offload_optimizer.sh
tail -n 12 $OUT/offload_optimizer.log

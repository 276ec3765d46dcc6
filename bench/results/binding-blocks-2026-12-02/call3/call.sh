#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/gpu_timing of main after 5fb18dc (its new
# `spread` subcommand). Is the 128K causal backward's slow mode (1.08-1.12 s against 0.84 s)
# a property of the process, of the tensors' addresses or of the moment? Two processes, each
# three rounds of freshly allocated inputs (earlier rounds kept, so addresses differ), each
# round three backwards timed alone, then one forward.
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
for p in 1 2; do
  nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
  timeout 200 .dev/gpu_timing spread --seq 131072 --rounds 3 --reps 3 | sed "s/^/process $p /" | tee -a $OUT/spread.txt
done

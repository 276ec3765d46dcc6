#!/usr/bin/env bash
# Device call (nvidia-h200): masks at 128K (issue 19) — ours causal, 8K documents and a 4K
# window beside FlexAttention on the same masks; binaries of call 1, carry [".dev"].
set -u
MASK_PART=timing BIN=.dev/distflash timeout 560 bash bench/peers/mask_bench.sh > $OUT/mask_timing.out 2>&1
echo "mask timing exit $?"; tail -n 25 $OUT/mask_timing.out

#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/ of 968e16c (main with shard16b merged:
# reduce_scatter_into by cuBLAS sgeam, one shared gathered layer for the virtual workers) by
# bench/peers/build_gpu_tests.sh. Issue 16's last criterion: the virtual-worker GPU tests,
# bench train 2:none / 2:full interleaved, the tiny-shape sharded training; then a quick
# check of the timing refactor (bench attention --blocks, gpu_timing spread).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
OUT=$OUT bash bench/peers/shard_full_speed.sh
cat $OUT/shard_full.log
.dev/distflash bench attention --device cuda --seqs 8192 --head-dims 128 --heads 32 --blocks 2 --json $OUT/blocks2.jsonl > /dev/null 2>&1; echo "blocks exit $?"
.dev/gpu_timing spread --seq 16384 --rounds 1 --reps 2; echo "spread exit $?"

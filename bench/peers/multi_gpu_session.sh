#!/usr/bin/env bash
# The multi-GPU issue's measurement, one call on nvidia-h200-x2 (not yet run): distflash on one
# and two GPUs with each schedule and the no-overlap ablation, MHA 32/32 and GQA 32/8, beside
# PyTorch's context parallel on the same shapes. Run from the repository root with $OUT set:
#   BIN=.dev/distflash SEQS="32768 131072" bash bench/peers/multi_gpu_session.sh
set -u
BIN=${BIN:-.dev/distflash}
SEQS=${SEQS:-32768 131072 262144}
REPS=${REPS:-5}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
for kv in 32 8; do
  for n in $SEQS; do
    shape="--seq-len $n --heads 32 --kv-heads $kv --head-dim 128 --repeats $REPS --json"
    timeout 300 "$BIN" attention --device cuda $shape > "$OUT/ours_1gpu_kv${kv}_n$n.json" 2>&1
    for run in "balanced" "unbalanced" "zigzag" "balanced --no-overlap" "zigzag --no-overlap"; do
      tag=$(echo "$run" | tr -d ' -')
      timeout 300 "$BIN" launch --nproc-per-node 2 -- attention --device cuda --schedule $run $shape \
        > "$OUT/ours_2gpu_${tag}_kv${kv}_n$n.json" 2>&1
    done
  done
  timeout 900 torchrun --nproc-per-node 2 bench/peers/context_parallel_bench.py --kv-heads "$kv" \
    --seqs "$(echo $SEQS | tr ' ' ',')" --reps "$REPS" --json "$OUT/torch_cp_kv$kv.jsonl"
done
grep -H -E '"(forward|backward)_secs"' "$OUT"/ours_*.json

#!/usr/bin/env bash
# One device call (nvidia-h200): distflash's training step (`bench train`, checkpoint remat and
# layer) and Hugging Face transformers' (bench/peers/hf_train_bench.py, gradient checkpointing
# on, SDPA) on the same LLaMA-7B shapes, forward+backward, no optimizer step. Writes three files
# to $OUT (a device call returns at most eight): ours.jsonl and hf.jsonl (one JSON line per run)
# and session.log (everything else, failures included). Run from the repository root:
#   BIN=.dev/gtrain/distflash SEQS="16384 32768" LAYERS=32 bash bench/peers/train_session.sh
# HF_CKPT=both adds Hugging Face without checkpointing. `distflash bench report --results DIR`
# on the returned folder tables both, with distflash's speedup over checkpointed transformers.
set -u
BIN=${BIN:-.dev/gtrain/distflash}
SEQS=${SEQS:-16384 32768}
LAYERS=${LAYERS:-32}
REPS=${REPS:-3}
HF_CKPT=${HF_CKPT:-on}
PEERS=$(dirname "$0")
LOG="$OUT/session.log"
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >> "$LOG" 2>&1
for n in $SEQS; do
  for ckpt in remat layer; do
    echo "=== distflash $ckpt seq $n layers $LAYERS" | tee -a "$LOG"
    if ! timeout 600 "$BIN" bench train --device cuda --preset llama2-7b --seq-len "$n" \
        --checkpoint "$ckpt" --layers "$LAYERS" --repeats "$REPS" --json \
        >> "$OUT/ours.jsonl" 2>> "$LOG"; then
      echo "distflash $ckpt seq $n failed: $(tail -n 1 "$LOG")"
    fi
  done
done
echo "=== hf seqs $SEQS layers $LAYERS checkpointing $HF_CKPT" | tee -a "$LOG"
timeout 900 python3 "$PEERS/hf_train_bench.py" --seq "$(echo $SEQS | tr ' ' ',')" \
  --layers "$LAYERS" --checkpointing "$HF_CKPT" --repeats "$REPS" --out "$OUT/hf.jsonl" \
  >> "$LOG" 2>&1 || echo "hf failed: $(tail -n 3 "$LOG")"

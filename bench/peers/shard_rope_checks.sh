#!/usr/bin/env bash
# The GPU-side checks of sharded training and rope scaling, in one device call after
# runtime_verify.sh's (it writes its own files; at most 8 come back per call, so run one of the
# two per call, or give each its own $OUT folder as session.sh does):
#   1. hf_parity.py --device cpu --rope-scaling llama3 and linear: loss and every gradient of a
#      model with Llama 3.1's (or position-interpolation) rotary scaling against transformers in
#      float64, ours in f32 within 1e-4 (the CPU of the GPU machine: it has transformers)
#   2. the short training run of gpu_train_checks.sh on the GPU with 2 and 3 virtual workers,
#      --shard full and --shard optimizer, beside --shard none: loss curves agree to bf16 noise
#      (compare_losses.py), so the sharded GPU paths (all-gather, reduce-scatter, 16-bit pieces,
#      AdamW on pieces) follow the unsharded one
# Run from the repository root on the GPU machine with the binaries in .dev/:
#   bash bench/peers/build_gpu_tests.sh   (here)   then   OUT=... bash bench/peers/shard_rope_checks.sh
set -u
BIN=${BIN_DIR:-.dev}/distflash
PEERS=$(dirname "$0")
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
LOG=$OUT/shard_rope.log
status=0
for scaling in llama3 linear; do
  timeout 200 $PY "$PEERS/hf_parity.py" --bin "$BIN" --out "$WORK/p_$scaling" --device cpu \
    --rope-scaling "$scaling" >> "$LOG" 2>&1
  echo "hf_parity --device cpu --rope-scaling $scaling: exit $?" | tee -a "$LOG"
  cp "$WORK/p_$scaling/hf_parity_$scaling.json" "$OUT/" 2>> "$LOG" || status=1
done
# The GPU parity model's shape (head dim 64), as in gpu_train_checks.sh.
timeout 200 $PY "$PEERS/hf_parity.py" --bin "$BIN" --out "$WORK/g" --device cuda > "$WORK/g.log" 2>&1
TRAIN="train --device cuda --config $WORK/g/hf-model/config.json --seq-len 512 --batch 4 --steps 20 --lr 3e-3 --json"
for run in "2 none" "2 full" "3 full" "2 optimizer" "3 grads"; do
  set -- $run
  echo "=== train --workers $1 --shard $2" >> "$LOG"
  timeout 120 "$BIN" $TRAIN --workers "$1" --shard "$2" > "$WORK/train_$1_$2.jsonl" 2>> "$LOG"
  echo "train --device cuda --workers $1 --shard $2: exit $?" | tee -a "$LOG"
  cat "$WORK/train_$1_$2.jsonl" >> "$LOG"
done
python3 "$PEERS/compare_losses.py" "$WORK/train_2_none.jsonl" "$WORK"/train_2_full.jsonl \
  "$WORK/train_3_full.jsonl" "$WORK/train_2_optimizer.jsonl" "$WORK/train_3_grads.jsonl" 2>&1 \
  | tee -a "$LOG" | tail -n 7
grep -h '"passed"' "$OUT"/hf_parity_*.json | tail -n 2
exit $status

#!/usr/bin/env bash
# One device call (nvidia-h200): the correctness checks of training on a GPU. Writes to $OUT:
#   gpu_tests.log       tests/gpu_ops.rs (every CudaOps op and the tiny model vs the CPU in f64)
#                       and tests/gpu_model_attention.rs (the model's attention adapter vs the
#                       fast path, the f64 oracle and virtual workers), run by gpu_tests.sh
#   parity.log, hf_parity_cuda.json
#                       bench/peers/hf_parity.py --device cuda: loss and every gradient vs
#                       transformers in float64, ours within 2x transformers' own bf16 error
#   train.log           the same short training run on the GPU (bf16) with 1 worker, with 2 and 3
#                       virtual workers sharing the GPU (distflash between them, zigzag and
#                       unbalanced: the multi-GPU training algorithm on one device), and on the
#                       CPU (f32): every loss curve must agree with the 1-worker GPU run to bf16
#                       noise and fall (bench/peers/compare_losses.py)
# Run from the repository root with the binaries built here by build_gpu_tests.sh:
#   bash bench/peers/build_gpu_tests.sh
#   BIN_DIR=.dev bash bench/peers/gpu_train_checks.sh          (device call, carry [".dev"])
set -u
BIN_DIR=${BIN_DIR:-.dev}
PEERS=$(dirname "$0")
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
status=0
BIN_DIR=$BIN_DIR TESTS="gpu_ops gpu_model_attention" bash "$PEERS/gpu_tests.sh" || status=1
PARITY=$(mktemp -d)
python3 "$PEERS/hf_parity.py" --bin "$BIN_DIR/distflash" --out "$PARITY" --device cuda \
  > "$OUT/parity.log" 2>&1 || { echo "hf_parity --device cuda failed"; status=1; }
cp "$PARITY/hf_parity_cuda.json" "$OUT/" 2>/dev/null
# The parity model's shape (head dim 64), trained briefly on the synthetic recall task.
TRAIN="train --config $PARITY/hf-model/config.json --seq-len 512 --batch 4 --steps 40 --lr 3e-3 --json"
for run in "cuda 1 balanced" "cuda 2 zigzag" "cuda 3 unbalanced" "cpu 1 balanced"; do
  set -- $run
  echo "=== train --device $1 --workers $2 --schedule $3" >> "$OUT/train.log"
  "$BIN_DIR/distflash" $TRAIN --device "$1" --workers "$2" --schedule "$3" \
    > "$PARITY/train_$1_$2.jsonl" 2>> "$OUT/train.log" || { echo "train $run failed"; status=1; }
  cat "$PARITY/train_$1_$2.jsonl" >> "$OUT/train.log"
done
python3 "$PEERS/compare_losses.py" "$PARITY/train_cuda_1.jsonl" "$PARITY/train_cuda_2.jsonl" \
  "$PARITY/train_cuda_3.jsonl" "$PARITY/train_cpu_1.jsonl" >> "$OUT/train.log" 2>&1 \
  || { echo "loss curves disagree"; status=1; }
tail -n 3 "$OUT"/*.log
exit $status

#!/usr/bin/env bash
# Issue 15's re-verification on one H200, in one device call: the GPU paths it reworked must
# reproduce the recorded figures within noise. Most important first; a step starts only if its
# timeout ends before LIMIT seconds (default 500; a device command is cut at 600), so the call
# ends in time and a slow step costs only the steps after it:
#   1. the GPU tests (tests/gpu_attention.rs, gpu_ops.rs, gpu_model_attention.rs)
#   2. `distflash attention --device cuda --check`: three shapes (each also saved and compared
#      with PyTorch float64 beside SDPA's bf16), and 4 balanced, 8 zigzag, 3 unbalanced virtual
#      workers sharing the GPU
#   3. bench/peers/hf_parity.py --device cuda (loss and gradients vs transformers in float64)
#   4. `bench train --device cuda --preset llama2-7b --seq-len 16384 --checkpoint remat`
#      (warm-up 1, 2 repeats, as recorded)
#   5. the short training run of gpu_train_checks.sh: 1 GPU worker, 2 zigzag and 3 unbalanced
#      virtual workers and the CPU, loss curves compared (compare_losses.py)
# then prints each new figure beside the recorded one (also in $OUT/summary.md). Files in $OUT
# (a call returns at most eight, so the call's command writes nothing else there: the console,
# which ends with the table, is the call's output): gpu_tests.log, attention_checks.log,
# parity.log, hf_parity_cuda.json, bench_train.jsonl, train.log, session.log, summary.md.
# The first run (commit c0aae7e, 215 s) is bench/results/runtime-verify-2026-12-01-c0aae7e.
# Run from the repository root on the GPU machine, binaries built here first:
#   bash bench/peers/build_gpu_tests.sh
#   bash bench/peers/runtime_verify.sh        (device call, nvidia-h200, carry [".dev"])
set -u
BIN_DIR=${BIN_DIR:-.dev}
BIN=$BIN_DIR/distflash
LIMIT=${LIMIT:-500}
PEERS=$(dirname "$0")
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
LOG=$OUT/session.log
WORK=$(mktemp -d)
# left SECS WHAT: whether a step with a timeout of SECS still fits; says so when it does not.
left() {
  [ $((SECONDS + $1)) -lt "$LIMIT" ] && return 0
  echo "skipped (at ${SECONDS} s of $LIMIT, needs $1 s): ${*:2}" | tee -a "$LOG"
  return 1
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv,noheader | tee -a "$LOG"

left 360 "GPU tests" && BIN_DIR=$BIN_DIR TIMEOUT=120 bash "$PEERS/gpu_tests.sh" 2>&1 | tee -a "$LOG"

# check TAG ARGS...: one `attention --check --json` run, its report appended to the log.
check() {
  local tag=$1; shift
  timeout 60 "$BIN" attention --device cuda --check --json "$@" > "$WORK/check.json" 2>> "$LOG"
  echo "attention $tag: exit $?" | tee -a "$LOG"
  { echo "=== $tag"; cat "$WORK/check.json"; } >> "$OUT/attention_checks.log"
}
for shape in "128 8 2 1000 bf16" "64 4 4 777 fp16" "128 32 8 4096 bf16"; do
  set -- $shape
  left 120 "attention $shape" || break
  f=$WORK/ours_d$1_h$2_$3_n$4_$5.safetensors
  check "d=$1 heads=$2/$3 seq=$4 $5" --head-dim "$1" --heads "$2" --kv-heads "$3" --seq-len "$4" --dtype "$5" --save "$f"
  { echo "=== torch d=$1 heads=$2/$3 seq=$4 $5"; timeout 60 $PY "$PEERS/check_against_torch.py" "$f" 2>&1 | grep '^{'; } \
    >> "$OUT/attention_checks.log"
done
for sched in "4 balanced" "8 zigzag" "3 unbalanced"; do
  set -- $sched
  left 60 "virtual workers $sched" || break
  check "virtual workers $1 $2" --workers "$1" --schedule "$2" --seq-len 3000 --heads 8 --kv-heads 2 --head-dim 128
done

left 180 "hf parity" && {
  timeout 180 $PY "$PEERS/hf_parity.py" --bin "$BIN" --out "$WORK/parity" --device cuda > "$OUT/parity.log" 2>&1
  echo "hf_parity --device cuda: exit $?" | tee -a "$LOG"
  cp "$WORK/parity/hf_parity_cuda.json" "$OUT/" 2>> "$LOG"
}

left 120 "bench train 16K" && {
  timeout 120 "$BIN" bench train --device cuda --preset llama2-7b --json --seq-len 16384 --checkpoint remat \
    --warmup 1 --repeats 2 >> "$OUT/bench_train.jsonl" 2>> "$LOG"
  echo "bench train 16K remat: exit $?" | tee -a "$LOG"
}

# The parity model's shape (head dim 64), trained briefly on the synthetic recall task.
TRAIN="train --config $WORK/parity/hf-model/config.json --seq-len 512 --batch 4 --steps 40 --lr 3e-3 --json"
for run in "cuda 1 balanced" "cuda 2 zigzag" "cuda 3 unbalanced" "cpu 1 balanced"; do
  set -- $run
  limit=60; [ "$1" = cpu ] && limit=150
  left $limit "train $run" || break
  echo "=== train --device $1 --workers $2 --schedule $3" >> "$OUT/train.log"
  timeout $limit "$BIN" $TRAIN --device "$1" --workers "$2" --schedule "$3" > "$WORK/train_$1_$2.jsonl" 2>> "$OUT/train.log"
  echo "train --device $1 --workers $2 --schedule $3: exit $?" | tee -a "$LOG"
  cat "$WORK/train_$1_$2.jsonl" >> "$OUT/train.log"
done
[ -s "$WORK/train_cpu_1.jsonl" ] && python3 "$PEERS/compare_losses.py" "$WORK"/train_cuda_{1,2,3}.jsonl \
  "$WORK/train_cpu_1.jsonl" >> "$OUT/train.log" 2>&1

python3 "$PEERS/runtime_verify_summary.py" "$OUT" | tee "$OUT/summary.md"
echo "elapsed $SECONDS s" | tee -a "$LOG"

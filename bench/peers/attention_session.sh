#!/usr/bin/env bash
# One device call for the single-GPU attention (issue: CUDA backend): correctness of the
# `distflash` binary against the f64 oracle and against PyTorch float64 (next to PyTorch's own
# 16-bit SDPA), then our timing sweep and PyTorch SDPA's on the same shapes, then the table.
# Run from the repository root on the GPU machine with $OUT set:
#   BIN=.dev/distflash bash bench/peers/attention_session.sh
# Files in $OUT: checks.log (every --check output), torch_check.log, then attention_tables.sh's
# (ours.jsonl, sdpa.jsonl, their logs, RESULTS.md); the console log is the caller's.
set -u
BIN=${BIN:-.dev/distflash}
SEQS=${BENCH_SEQS:-4096,16384,65536}
DIMS=${BENCH_DIMS:-128,64}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
export PYTHONUNBUFFERED=1
step() { echo "=== $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
# Shapes: head dims 64 and 128, MHA and GQA, lengths that are and are not multiples of 128.
for shape in "128 8 8 1000 bf16" "128 8 2 1000 bf16" "64 8 2 2048 bf16" "64 4 4 777 fp16" "128 32 8 4096 bf16"; do
  set -- $shape
  step "check d=$1 heads=$2/$3 seq=$4 $5"
  f=/tmp/ours_d$1_h$2_$3_n$4_$5.safetensors
  timeout 300 "$BIN" attention --device cuda --head-dim "$1" --heads "$2" --kv-heads "$3" --seq-len "$4" \
    --dtype "$5" --check --json --save "$f" > /tmp/check.json 2>&1
  echo "oracle check exit $?: $(grep -o '"passed": [a-z]*' /tmp/check.json)"
  { echo "=== d=$1 heads=$2/$3 seq=$4 $5"; cat /tmp/check.json; } >> "$OUT/checks.log"
  timeout 300 python3 bench/peers/check_against_torch.py "$f" 2>&1 | tee -a "$OUT/torch_check.log"
done
# Virtual workers: the distributed schedules on one GPU (transfers are device copies), exact.
for sched in "4 balanced" "8 zigzag" "3 unbalanced"; do
  set -- $sched
  step "virtual workers: $1 $2"
  timeout 300 "$BIN" attention --device cuda --workers "$1" --schedule "$2" --seq-len 3000 --heads 8 \
    --kv-heads 2 --head-dim 128 --check --json > /tmp/check.json 2>&1
  echo "exit $?: $(grep -o '"passed": [a-z]*' /tmp/check.json)"
  { echo "=== virtual workers $1 $2"; cat /tmp/check.json; } >> "$OUT/checks.log"
done
step "bench distflash and sdpa"
BIN="$BIN" TIMEOUT=400 bash bench/peers/attention_tables.sh "$OUT" "$SEQS" "$DIMS"

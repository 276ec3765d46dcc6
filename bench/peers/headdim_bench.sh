#!/usr/bin/env bash
# One device call for the head dims of issue 18 (64, 80, 96, 128, 192, 256): correctness of the
# `distflash` binary against the f64 oracle at each head dim (whole sequence and 4 virtual
# workers through the block API, bf16 and fp16, GQA and MQA, odd lengths, one masked), then
# our causal forward and backward TFLOP/s beside PyTorch SDPA's cuDNN and FlashAttention-2
# backends on the same shapes (bf16, batch 1, 32 heads), and the table with ours / theirs.
# Run from the repository root on the GPU machine with $OUT set (carry [".dev"]):
#   BIN=.dev/distflash bash bench/peers/headdim_bench.sh
# HEADDIM_SEQS (default 8192,32768) and HEADDIM_DIMS (default all six) narrow it.
# Files in $OUT: checks.log, then attention_tables.sh's (ours.jsonl, sdpa.jsonl, their logs,
# RESULTS.md). Exit status non-zero if a check or a timer failed.
set -u
BIN=${BIN:-.dev/distflash}
SEQS=${HEADDIM_SEQS:-8192,32768}
DIMS=${HEADDIM_DIMS:-64,80,96,128,192,256}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
export PYTHONUNBUFFERED=1
step() { echo "=== $*"; }
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
for d in ${DIMS//,/ }; do
  for shape in "1 8 2 1000 bf16" "4 4 1 777 fp16" "1 4 4 901 bf16 --doc-lens 300,1,400,200 --global 3"; do
    set -- $shape
    step "check d=$d workers=$1 heads=$2/$3 seq=$4 $5 ${*:6}"
    timeout 120 "$BIN" attention --device cuda --head-dim "$d" --workers "$1" --heads "$2" \
      --kv-heads "$3" --seq-len "$4" --dtype "$5" "${@:6}" --check --json > /tmp/check.json 2>&1
    rc=$?
    echo "exit $rc: $(grep -o '"passed": [a-z]*' /tmp/check.json)"
    [ $rc -eq 0 ] || status=1
    { echo "=== d=$d $shape"; cat /tmp/check.json; } >> "$OUT/checks.log"
  done
done
step "bench distflash and sdpa"
BIN="$BIN" bash bench/peers/attention_tables.sh "$OUT" "$SEQS" "$DIMS" --heads 32 || status=1
exit $status

#!/usr/bin/env bash
# One device call for masks in the CUDA kernels (issue 19): correctness under masks (the
# distributed `attention --device cuda --workers 1..4` against the f64 oracle, and ours against
# PyTorch float64 beside PyTorch's own bf16 SDPA and FlexAttention on the same mask), then at
# 128K tokens, bf16, 32 heads, d128, batch 1: our causal time, our time with packed 8K-token
# documents and with a 4K sliding window, FlexAttention's on the same masks, and the summary
# (ours within 1.2x of the ideal = causal time x visible fraction; error at most 2x PyTorch's).
# Run from the repository root on the GPU machine with $OUT set (carry [".dev"]):
#   BIN=.dev/distflash bash bench/peers/mask_bench.sh
#   MASK_PART=checks ... ; MASK_PART=timing ...   # the two halves, each a device call of its own
# Files in $OUT: checks.log, torch_checks.jsonl, ours.jsonl, flex.jsonl, mask_bench.json (the
# summary: with MASK_PART=timing it has no accuracy rows).
set -u
BIN=${BIN:-.dev/distflash}
SEQ=${MASK_SEQ:-131072}
PART=${MASK_PART:-all}
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
export PYTHONUNBUFFERED=1
step() { echo "=== $*"; }
# L repeated to cover N tokens: the --doc-lens of documents of L tokens (N a multiple of L).
docs() { python3 -c "import sys; n, l = int(sys.argv[1]), int(sys.argv[2]); print(','.join([str(l)] * (n // l)))" "$1" "$2"; }
status=0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv

if [ "$PART" != timing ]; then
# Distributed under masks on virtual workers: every worker count must pass the oracle check.
for mask in "--docs random:9" "--window 700 --global 3" "--doc-lens 1,2999,1000 --window 333"; do
  for w in 1 2 3 4; do
    step "attention --workers $w $mask"
    timeout 300 "$BIN" attention --device cuda --workers "$w" --schedule greedy --seq-len 4000 \
      --heads 8 --kv-heads 2 --head-dim 128 $mask --check --json > /tmp/check.json 2>&1
    rc=$?
    echo "exit $rc: $(grep -o '"passed": [a-z]*' /tmp/check.json)"
    [ $rc -eq 0 ] || status=1
    { echo "=== workers $w $mask"; cat /tmp/check.json; } >> "$OUT/checks.log"
  done
done

# Accuracy at 8K (8 heads: the float64 reference holds every score) against PyTorch's bf16.
for spec in "1024 0 0" "0 1024 0" "2048 512 16"; do
  set -- $spec
  flags=""
  [ "$1" -gt 0 ] && flags="$flags --doc-lens $(docs 8192 "$1")"
  [ "$2" -gt 0 ] && flags="$flags --window $2"
  [ "$3" -gt 0 ] && flags="$flags --global $3"
  step "accuracy doc_len=$1 window=$2 global=$3"
  f=/tmp/mask_$1_$2_$3.safetensors
  timeout 300 "$BIN" attention --device cuda --seq-len 8192 --heads 8 --kv-heads 8 --head-dim 128 \
    --dtype bf16 $flags --save "$f" --json > /tmp/acc.json 2>&1 || { status=1; tail -3 /tmp/acc.json; }
  timeout 400 $PY bench/peers/mask_bench.py check "$f" --doc-len "$1" --window "$2" \
    --global "$3" --json "$OUT/torch_checks.jsonl" || status=1
done
fi
[ "$PART" = checks ] && exit $status

# Timing at 128K: ours (causal first, then the two masks), then FlexAttention on the same masks.
step "ours"
# `bench attention --json` writes its file afresh: one file a run, joined into ours.jsonl.
for i in 1 2 3; do
  case $i in
    1) flags="" ;;
    2) flags="--doc-lens $(docs "$SEQ" 8192)" ;;
    3) flags="--window 4096" ;;
  esac
  timeout 500 "$BIN" bench attention --device cuda --seqs "$SEQ" --head-dims 128 --heads 32 \
    $flags --json "$OUT/ours_$i.jsonl" 2>&1 | tail -n 2
done
cat "$OUT"/ours_[123].jsonl > "$OUT/ours.jsonl" && rm -f "$OUT"/ours_[123].jsonl
step "flex_attention"
timeout 500 $PY bench/peers/mask_bench.py time --seq "$SEQ" --doc-len 8192 --json "$OUT/flex.jsonl" || status=1
timeout 500 $PY bench/peers/mask_bench.py time --seq "$SEQ" --window 4096 --json "$OUT/flex.jsonl" || status=1
step "summary"
checks=()
[ -s "$OUT/torch_checks.jsonl" ] && checks=(--checks "$OUT/torch_checks.jsonl")
$PY bench/peers/mask_bench.py summary --ours "$OUT/ours.jsonl" --flex "$OUT/flex.jsonl" \
  "${checks[@]}" --json "$OUT/mask_bench.json" || status=1
exit $status

#!/usr/bin/env bash
# Our causal attention TFLOP/s (`distflash bench attention`) beside PyTorch SDPA's
# FlashAttention-2 and cuDNN backends (`sdpa_bench.py`) on the same shapes, in one device call,
# and the table of ours over theirs (`distflash bench report`): issue 18's tables. Run from the
# repository root on the GPU machine (carry [".dev"], after build_gpu_tests.sh here):
#   bash bench/peers/attention_tables.sh DIR SEQS HEAD_DIMS [FLAGS...]
#   e.g. bash bench/peers/attention_tables.sh $OUT/runs/gqa 4096,8192 128 --kv-heads 8
# FLAGS go to both timers (--heads, --kv-heads, --dtype). DIR gets ours.jsonl, sdpa.jsonl, their
# logs and RESULTS.md. BIN (default .dev/distflash) and TIMEOUT (seconds for each timer, default
# 240) may be set. Exit status non-zero if either timer failed.
set -u
if [ $# -lt 3 ]; then
  echo "usage: attention_tables.sh DIR SEQS HEAD_DIMS [FLAGS...]" >&2
  exit 2
fi
DIR=$1 SEQS=$2 DIMS=$3
shift 3
BIN=${BIN:-.dev/distflash}
T=${TIMEOUT:-240}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
mkdir -p "$DIR"
status=0
timeout "$T" "$BIN" bench attention --device cuda --seqs "$SEQS" --head-dims "$DIMS" "$@" \
  --json "$DIR/ours.jsonl" > "$DIR/ours.log" 2>&1
rc=$?; echo "ours: exit $rc"; [ $rc -eq 0 ] || status=1
timeout "$T" python3 bench/peers/sdpa_bench.py --seqs "$SEQS" --head-dims "$DIMS" "$@" \
  --json "$DIR/sdpa.jsonl" > "$DIR/sdpa.log" 2>&1
rc=$?; echo "sdpa: exit $rc"; [ $rc -eq 0 ] || status=1
"$BIN" bench report --results "$DIR" --out "$DIR/RESULTS.md" && grep "^| [0-9]" "$DIR/RESULTS.md"
exit $status

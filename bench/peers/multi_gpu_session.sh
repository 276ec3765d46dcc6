#!/usr/bin/env bash
# The multi-GPU issue's measurement, one call on nvidia-h200-x2 (not yet run): distflash on one
# and two GPUs with each schedule and the no-overlap ablation, MHA 32/32 and GQA 32/8, beside
# PyTorch's context parallel on the same shapes. Writes few files (a device call returns at
# most eight): ours.jsonl (one compact line per run, tagged), torch_cp_kv*.jsonl, failures.log.
# Run from the repository root with $OUT set:
#   BIN=.dev/distflash SEQS="32768 131072" bash bench/peers/multi_gpu_session.sh
set -u
BIN=${BIN:-.dev/distflash}
SEQS=${SEQS:-32768 131072 262144}
REPS=${REPS:-5}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
# run TAG COMMAND...: appends the run's JSON report, compacted and tagged, to ours.jsonl.
run() {
  local tag=$1; shift
  if timeout 400 "$@" > /tmp/run.json 2> /tmp/run.err; then
    python3 -c "import json,sys; r=json.load(open('/tmp/run.json')); r['tag']=sys.argv[1]; print(json.dumps(r))" \
      "$tag" >> "$OUT/ours.jsonl"
    echo "$tag: $(grep -E '"(forward|backward)_secs"' /tmp/run.json | tr -d '\n ')"
  else
    echo "$tag failed: $(tail -c 400 /tmp/run.err)" | tee -a "$OUT/failures.log"
  fi
}
for kv in 32 8; do
  for n in $SEQS; do
    shape="--seq-len $n --heads 32 --kv-heads $kv --head-dim 128 --repeats $REPS --json"
    run "1gpu kv$kv n$n" "$BIN" attention --device cuda $shape
    for sched in "balanced" "unbalanced" "zigzag" "balanced --no-overlap" "zigzag --no-overlap"; do
      run "2gpu $sched kv$kv n$n" "$BIN" launch --nproc-per-node 2 -- attention --device cuda --schedule $sched $shape
    done
  done
  timeout 900 torchrun --nproc-per-node 2 bench/peers/context_parallel_bench.py --kv-heads "$kv" \
    --seqs "$(echo $SEQS | tr ' ' ',')" --reps "$REPS" --json "$OUT/torch_cp_kv$kv.jsonl"
done

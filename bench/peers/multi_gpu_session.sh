#!/usr/bin/env bash
# The multi-GPU issue's measurement, one call on nvidia-h200-x2: exactness on one and two GPUs
# (f64 oracle, and PyTorch float64 on a gathered --save), then distflash on one and two GPUs with
# each schedule and the no-overlap ablation, MHA 32/32 and GQA 32/8, beside PyTorch's context
# parallel on the same shapes. Writes few files (a device call returns at most eight):
# checks.log, ours.jsonl (one compact line per run, tagged), torch_cp_kv*.jsonl, failures.log.
# KV_SEQS lists, per KV-head count, the global sequence lengths; SCHEDS the two-GPU schedules
# (flags of `attention`, comma-separated); CHECKS=0 skips the exactness checks. PyTorch's runs
# come first for each KV-head count, so a call cut short still has the peer. Run from the
# repository root with $OUT set:
#   BIN=.dev/distflash KV_SEQS="32:32768,131072,262144 8:32768,131072" bash bench/peers/multi_gpu_session.sh
set -u
BIN=${BIN:-.dev/distflash}
KV_SEQS=${KV_SEQS:-32:32768,131072,262144 8:32768,131072,262144}
REPS=${REPS:-5}
SCHEDS=${SCHEDS:-balanced,unbalanced,zigzag,balanced --no-overlap,zigzag --no-overlap}
CHECKS=${CHECKS:-1}
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
[ "$CHECKS" = 1 ] && {
  for sched in "1 balanced" "2 balanced" "2 zigzag"; do
    set -- $sched
    f=/tmp/check_$1_$2.safetensors
    echo "=== check: $1 GPU(s), $2, GQA 8/2, seq 3000"
    timeout 120 "$BIN" launch --nproc-per-node "$1" -- attention --device cuda --schedule "$2" --seq-len 3000 \
      --heads 8 --kv-heads 2 --head-dim 128 --check --save "$f" --rendezvous-timeout 30 --timeout 60 2>&1 | tail -n 4
    timeout 120 python3 bench/peers/check_against_torch.py "$f" 2>&1
  done
} > "$OUT/checks.log" 2>&1
[ "$CHECKS" = 1 ] && grep -E "passed|\"pass\"|error" "$OUT/checks.log" | cut -c1-300
for pair in $KV_SEQS; do
  kv=${pair%%:*}
  seqs=${pair#*:}
  timeout 900 torchrun --nproc-per-node 2 bench/peers/context_parallel_bench.py --kv-heads "$kv" \
    --seqs "$seqs" --reps "$REPS" --json "$OUT/torch_cp_kv$kv.jsonl"
  for n in ${seqs//,/ }; do
    shape="--seq-len $n --heads 32 --kv-heads $kv --head-dim 128 --repeats $REPS --json"
    run "1gpu kv$kv n$n" "$BIN" attention --device cuda $shape
    IFS=, read -ra scheds <<< "$SCHEDS"
    for sched in "${scheds[@]}"; do
      run "2gpu $sched kv$kv n$n" "$BIN" launch --nproc-per-node 2 -- attention --device cuda --schedule $sched $shape
    done
  done
done

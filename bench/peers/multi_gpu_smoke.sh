#!/usr/bin/env bash
# First run of the one-process-per-GPU path (NCCL) on two GPUs: exactness against the f64
# oracle with both one-chunk and two-chunk schedules, then forward+backward times at 32K for
# the schedules beside the single-GPU run. Run from the repository root with $OUT set:
#   BIN=.dev/distflash bash bench/peers/multi_gpu_smoke.sh
set -u
BIN=${BIN:-.dev/distflash}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
step() { echo "=== $*"; }
nvidia-smi --query-gpu=index,name --format=csv
for sched in balanced zigzag; do
  step "2 GPUs, $sched, check"
  timeout 120 "$BIN" launch --nproc-per-node 2 -- attention --device cuda --schedule "$sched" \
    --seq-len 4096 --heads 8 --kv-heads 2 --head-dim 128 --check --json --rendezvous-timeout 30 --timeout 60 \
    > "$OUT/nccl_check_$sched.json" 2> "$OUT/nccl_check_$sched.err"
  echo "exit $?: $(grep -o '"passed": [a-z]*' "$OUT/nccl_check_$sched.json") $(tail -c 300 "$OUT/nccl_check_$sched.err")"
done
step "1 GPU, 32K"
timeout 120 "$BIN" attention --device cuda --seq-len 32768 --heads 32 --kv-heads 32 --head-dim 128 --json \
  > "$OUT/time_1gpu_32k.json" 2>&1; grep -E '"(forward|backward)_secs"' "$OUT/time_1gpu_32k.json"
for sched in balanced zigzag unbalanced; do
  step "2 GPUs, $sched, 32K"
  timeout 120 "$BIN" launch --nproc-per-node 2 -- attention --device cuda --schedule "$sched" --seq-len 32768 \
    --heads 32 --kv-heads 32 --head-dim 128 --json --rendezvous-timeout 30 --timeout 60 > "$OUT/time_2gpu_32k_$sched.json" 2>&1
  grep -E '"(forward|backward)_secs"' "$OUT/time_2gpu_32k_$sched.json" || tail -c 400 "$OUT/time_2gpu_32k_$sched.json"
done

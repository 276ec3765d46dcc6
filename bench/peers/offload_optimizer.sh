#!/usr/bin/env bash
# The GPU checks of `--offload optimizer` (issue 17, item 2): AdamW's moments in pinned host
# memory, streamed through the GPU by the update. Sections (SECTIONS, default "gpu_ops 64k"):
#   gpu_ops  tests/gpu_ops.rs's offload tests (bf16 and fp16): three AdamW steps with the moments
#            offloaded give the same weights and moments, bit for bit, as with them on the GPU;
#            and the activations' offload test beside it
#   64k      llama2-7b `train --device cuda --batch 1 --steps 2` at 64K tokens with AdamW, without
#            offload and with --offload optimizer: each step's time (the update's copies are the
#            difference) and peak GPU memory (nvidia-smi, every 0.5 s) beside the estimate; the
#            first step's loss must be the same bits (it comes before any update)
#   256k     the same at 256K with --offload all and --checkpoint layer (CHECKPOINT256), STEPS256
#            steps (default 1, a step is ~200-250 s). Its pinned host memory is 64 GiB of layer
#            checkpoints (x only) + 50.2 GiB of moments: it fits a 128 GiB host now that a run
#            without --save-dir gathers no final f32 weights (under remat the checkpoints are
#            129 GiB: that needs a host with 256 GiB, nvidia-h200-x2)
# Run from the repository root on the GPU machine with the binaries in .dev/:
#   bash bench/peers/build_gpu_tests.sh   (here)   then   OUT=... bash bench/peers/offload_optimizer.sh
# Writes under $OUT: offload_optimizer.log (commands, exit codes, stderr with the estimates),
# gpu_ops.log, train_<seq>_<offload>.json (train --json's lines), mem_<seq>_<offload>.log
# (nvidia-smi MiB samples) and summary.jsonl (one line a run: step seconds, peak MiB, estimate).
set -u
DEV=${BIN_DIR:-.dev}
BIN=$DEV/distflash
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache-offload}
SECTIONS=${SECTIONS:-gpu_ops 64k}
LOG=$OUT/offload_optimizer.log
SUMMARY=$OUT/summary.jsonl
: > "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOG"
free -g >> "$LOG"
echo "sections: $SECTIONS" >> "$LOG"
wanted() { [[ " $SECTIONS " == *" $1 "* ]]; }

# One training run of llama2-7b over $1 tokens with --offload $2 for $3 steps under
# --checkpoint $4 (default remat), its GPU memory sampled beside it; appends a summary line.
train_run() {
  local seq=$1 offload=$2 steps=$3 checkpoint=${4:-remat} tag="$1_${2//,/+}"
  local json=$OUT/train_$tag.json mem=$OUT/mem_$tag.log
  echo "=== train $seq --offload $offload --steps $steps --checkpoint $checkpoint" >> "$LOG"
  "$BIN" bench train --estimate --json --optimizer --preset llama2-7b --seq-len "$seq" \
    --offload "$offload" --checkpoint "$checkpoint" > "$OUT/estimate_$tag.json" 2>> "$LOG"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 500 > "$mem" &
  local smi=$! t0 t1 rc
  t0=$(date +%s%N)
  timeout "${TRAIN_TIMEOUT:-560}" "$BIN" train --device cuda --preset llama2-7b --batch 1 \
    --steps "$steps" --seq-len "$seq" --lr 1e-5 --offload "$offload" --checkpoint "$checkpoint" \
    --json > "$json" 2>> "$LOG"
  rc=$?
  t1=$(date +%s%N)
  kill "$smi"
  wait "$smi" 2> /dev/null
  local peak step_secs loss est
  peak=$(sort -n "$mem" | tail -n 1)
  step_secs=$(grep -o '"step_secs":[0-9.e+-]*' "$json" | cut -d: -f2 | paste -sd, -)
  loss=$(grep -o '"loss":[0-9.e+-]*' "$json" | cut -d: -f2 | paste -sd, -)
  est=$(grep -o '"estimated_gib":[0-9.e+-]*' "$OUT/estimate_$tag.json" | cut -d: -f2)
  echo "exit $rc, wall $(( (t1 - t0) / 1000000 )) ms" >> "$LOG"
  echo "{\"seq\":$seq,\"offload\":\"$offload\",\"checkpoint\":\"$checkpoint\",\"steps\":$steps,\"exit\":$rc,\"wall_ms\":$(( (t1 - t0) / 1000000 )),\"step_secs\":[${step_secs}],\"losses\":[${loss}],\"peak_used_mib\":${peak:-null},\"estimated_gib\":${est:-null}}" >> "$SUMMARY"
}

if wanted gpu_ops; then
  DISTFLASH_GPU_TESTS=1 timeout 300 "$DEV/gpu_ops" offloaded --include-ignored --test-threads 1 --nocapture \
    > "$OUT/gpu_ops.log" 2>&1
  echo "gpu_ops offloaded: exit $?" >> "$LOG"
fi
if wanted 64k; then
  train_run 65536 none 2
  train_run 65536 optimizer 2
  # Step 1's loss comes before any update: the same bits with the moments offloaded or not.
  first() { grep -o '"loss":[0-9.e+-]*' "$OUT/train_65536_$1.json" | head -n 1; }
  if [ -n "$(first none)" ] && [ "$(first none)" = "$(first optimizer)" ]; then
    echo "step 1 loss, offloaded moments against not: the same bits PASS" >> "$LOG"
  else
    echo "step 1 loss, offloaded moments against not: $(first none) vs $(first optimizer) FAIL" >> "$LOG"
  fi
fi
if wanted 256k; then
  train_run 262144 all "${STEPS256:-1}" "${CHECKPOINT256:-layer}"
fi
cat "$SUMMARY" >> "$LOG"

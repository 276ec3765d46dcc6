#!/usr/bin/env bash
# One device call: the peak GPU memory of the steps whose peaks `the_count_is_the_measured_h200_peak`
# (src/train/memory/estimate.rs) pins the memory count to, measured by `bench train --device cuda
# --json` (the pool's high-water mark, `peak_memory_gib`): llama2-7b, bf16, no optimizer step, the
# policy on every layer (--whole-layers 0).
# Each fits an 80 GB H100; the allocator's peak is the same on an H100 and an H200 (both sm_90).
# Writes peaks.jsonl (one line per step: layers, tokens, policy, offload, the bench's JSON) and
# peaks.log to $OUT. Run from the repository root with the binary built here
# (bash bench/peers/build_gpu_tests.sh; device call with carry [".dev"]):
#   bash bench/peers/measured_peaks.sh
set -u
BIN=${BIN:-.dev/distflash}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
status=0
for step in "32 16384 remat none" "32 16384 layer none" "32 32768 remat none" \
            "32 32768 layer none" "4 524288 layer activations"; do
  set -- $step
  echo "+ bench train --layers $1 --seq-len $2 --checkpoint $3 --offload $4" >> "$OUT/peaks.log"
  json=$(timeout 300 "$BIN" bench train --device cuda --preset llama2-7b --layers "$1" --seq-len "$2" \
      --checkpoint "$3" --whole-layers 0 --offload "$4" --warmup 1 --repeats 1 --json \
      2>> "$OUT/peaks.log") || status=1
  echo "{\"layers\":$1,\"seq\":$2,\"checkpoint\":\"$3\",\"offload\":\"$4\",\"bench\":${json:-null}}" \
    >> "$OUT/peaks.jsonl"
done
python3 - "$OUT/peaks.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    peak = (r["bench"] or {}).get("peak_memory_gib")
    print(f'({r["layers"]}, {r["seq"]}, {r["checkpoint"]}, {r["offload"]}): {peak!r}')
PY
exit $status

#!/usr/bin/env bash
# On the GPU machine: two builds' gpu_timing timed against each other, alternated so that the
# clock and the machine drift alike over both (a kernel change's A/B run). Each round times
# each shape group with build A, then with build B. Run from the repository root with $OUT set
# (device call, carry [".dev"]), the builds' folders each holding a gpu_timing:
#   bash bench/peers/ab_attention.sh .dev/base .dev 2 4096,8192:128 8192,32768:64,256:--kv-heads,8
# A group is SEQS:HEAD_DIMS[:FLAGS], FLAGS given to `gpu_timing attention` (commas
# for spaces). Writes $OUT/runs/ab_<group>_<build>_<round>.jsonl (build = A's or B's folder name)
# and prints one line per run: the forward and backward TFLOP/s of each shape.
set -u
if [ $# -lt 4 ]; then
  echo "usage: ab_attention.sh BUILD_A BUILD_B ROUNDS SEQS:HEAD_DIMS[:FLAGS]..." >&2
  exit 2
fi
A=$1 B=$2 ROUNDS=$3
shift 3
R=${OUT:?set OUT}/runs
mkdir -p "$R"
for build in "$A" "$B"; do
  [ -x "$build/gpu_timing" ] || { echo "ab_attention: no $build/gpu_timing" >&2; exit 2; }
done
summary() {
  [ -s "$1" ] || { echo "no results (see $(basename "${1%.jsonl}").err)"; return; }
  python3 -c "
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq'] // 1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')
print()" "$1" 2>&1
}
status=0
for round in $(seq 1 "$ROUNDS"); do
  g=0
  for group in "$@"; do
    g=$((g + 1))
    IFS=: read -r seqs dims flags <<< "$group"
    for build in "$A" "$B"; do
      name=$(basename "$build")
      json=$R/ab_${g}_${name}_$round.jsonl
      # shellcheck disable=SC2086 # FLAGS are words
      timeout 300 "$build/gpu_timing" attention --seqs "$seqs" --head-dims "$dims" ${flags//,/ } \
        --json "$json" > /dev/null 2> "${json%.jsonl}.err"
      rc=$?
      [ $rc -eq 0 ] || status=1
      echo "$name round $round group $g ($group): exit $rc $(summary "$json")"
    done
  done
done
exit $status

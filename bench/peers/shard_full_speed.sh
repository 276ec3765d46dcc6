#!/usr/bin/env bash
# The GPU check of issue 16's last criterion: llama2-7b's 16K step (`bench train`, remat) over 2
# virtual workers with --shard full against --shard none, and the GPU paths under it:
#   tests  tests/gpu_ops.rs's virtual-worker tests: reduce_scatter_into (cuBLAS sgeam) and the
#          shared all-gather (rank 0's one copy, read by the other workers through views of its
#          memory) against the host's, bit for bit, with their counted bytes; and the GPU pool
#          growing by one copy, not one per worker, while the workers hold a shared gather
#   bench  `bench train` 2:none and 2:full, twice each, interleaved (drift shows as a change
#          between repeats); with .dev/old/distflash (a build of the commit before, e.g.
#          `DEST=.dev/old bash bench/peers/build_gpu_tests.sh` in a checkout of it) also the old
#          binary's 2:full between them
#   shard  startup_checks.sh's tiny-shape training under every --shard on 2 and 3 virtual
#          workers against --shard none (compare_losses.py): the views and sgeam in training
# Run from the repository root on the GPU machine with the binaries in .dev/:
#   bash bench/peers/build_gpu_tests.sh   (here)   then   OUT=... bash bench/peers/shard_full_speed.sh
# SECTIONS="bench" runs only those (of: tests bench shard). Passing: the tests' "PASS" lines and
# exit 0; every bench run exit 0 with 2:full's step_secs within the 2:none repeats' spread (or
# below); compare_losses.py's lines all within its bound.
set -u
BIN=${BIN_DIR:-.dev}/distflash
PEERS=$(dirname "$0")
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
SECTIONS=${SECTIONS:-tests bench shard}
LOG=$OUT/shard_full.log
: > "$LOG"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); sections: $SECTIONS" >> "$LOG"
wanted() { [[ " $SECTIONS " == *" $1 "* ]]; }

if wanted tests; then
  LOG=$OUT/gpu_tests.log TESTS=gpu_ops TIMEOUT=100 bash "$PEERS/gpu_tests.sh" virtual_workers
  echo "virtual-worker collectives: exit $?" | tee -a "$LOG"
  grep -E "PASS|FAIL|test result|panicked" "$OUT/gpu_tests.log" | tail -n 10 >> "$LOG"
fi

if wanted bench; then
  B="bench train --device cuda --preset llama2-7b --seq-len 16384 --checkpoint remat --json"
  RUNS="new:none new:full old:full new:none new:full"
  for run in $RUNS; do
    bin=$BIN
    if [ "${run%%:*}" = old ]; then
      bin=${BIN_DIR:-.dev}/old/distflash
      [ -x "$bin" ] || continue
    fi
    shard=${run#*:}
    timeout "${BENCH_TIMEOUT:-150}" "$bin" $B --workers 2 --shard "$shard" > "$OUT/run.json" 2> "$OUT/run.err"
    rc=$?
    { echo "=== ${run%%:*} 2 workers --shard $shard: exit $rc"; cat "$OUT/run.json" "$OUT/run.err"; } >> "$OUT/bench_train.log"
    echo "${run%%:*} 2 $shard: exit $rc $(grep -o '"step_secs":[0-9.]*\|"all_secs":\[[0-9.,]*\]\|"peak_memory_gib":[0-9.]*' "$OUT/run.json" | paste -sd' ')" | tee -a "$LOG"
  done
  rm -f "$OUT/run.json" "$OUT/run.err"
fi

if wanted shard; then
  mkdir -p "$OUT/shard"
  OUT=$OUT/shard SECTIONS=shard timeout 200 bash "$PEERS/startup_checks.sh" > /dev/null 2>&1
  echo "shard section: exit $?" | tee -a "$LOG"
  grep -iE "pass|fail|exit" "$OUT/shard/startup.log" | tail -n 8 | tee -a "$LOG"
fi

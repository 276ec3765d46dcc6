#!/usr/bin/env bash
# On the GPU machine: runs the GPU test binaries that build_gpu_tests.sh put in .dev/, with
# DISTFLASH_GPU_TESTS=1 and --include-ignored (the tests are ignored unless asked for; a
# missing GPU then fails them instead of skipping), one test at a time
# and with their printed figures kept, into one log, $OUT/gpu_tests.log. Run from the
# repository root with $OUT set (device call, carry [".dev"]):
#   bash bench/peers/gpu_tests.sh                        # all three
#   TESTS=gpu_ops bash bench/peers/gpu_tests.sh rmsnorm  # one binary, tests whose name has "rmsnorm"
#   DISTFLASH_TUNING=bwd-warps=4 bash bench/peers/gpu_tests.sh   # a kernel variant
# Arguments go to each test binary (a name filter, --exact, …); TIMEOUT (s, default 300) bounds
# each binary. Exit status non-zero if any failed.
set -u
BIN_DIR=${BIN_DIR:-.dev}
TESTS=${TESTS:-gpu_attention gpu_ops gpu_model_attention}
LOG=${LOG:-$OUT/gpu_tests.log}
TIMEOUT=${TIMEOUT:-300}
# Errors without backtraces (a panic still prints its own).
export DISTFLASH_GPU_TESTS=1 DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} RUST_LIB_BACKTRACE=${RUST_LIB_BACKTRACE:-0}
status=0
for t in $TESTS; do
  echo "=== $t $* ${DISTFLASH_TUNING:+(DISTFLASH_TUNING=$DISTFLASH_TUNING)}" >> "$LOG"
  if timeout "$TIMEOUT" "$BIN_DIR/$t" --include-ignored --test-threads 1 --nocapture "$@" >> "$LOG" 2>&1; then
    echo "$t passed"
  else
    echo "$t FAILED (see $(basename "$LOG"))"
    status=1
  fi
done
exit $status

#!/usr/bin/env bash
# Device call 1 (nvidia-h200), binaries of the commit in $OUT/commit built by
# bench/peers/build_gpu_tests.sh, carry [".dev"]:
#   the GPU test binaries (last session's unverified changes) beside the config parity cases not
#   yet run on the GPU (correctness only, so they share the GPU), then the virtual-worker bench.
set -u
git rev-parse --short HEAD > $OUT/commit 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt
(bash bench/peers/gpu_tests.sh > $OUT/gpu_tests.summary 2>&1) &
mkdir -p $OUT/parity
(OUT=$OUT/parity CASES="llama3:cpu llama3:cuda linear:cpu linear:cuda dynamic:cuda mistral:cuda qwen2_yarn:cuda" \
  bash bench/peers/config_parity.sh > $OUT/parity/summary.txt 2>&1) &
wait
cat $OUT/gpu_tests.summary $OUT/parity/summary.txt
OUT=$OUT SECTIONS="bench" BENCH_RUNS="1:none 2:none 2:full" bash bench/peers/startup_checks.sh
tail -c 3000 $OUT/startup.log
cd $OUT && tar czf parity.tgz parity && rm -rf parity

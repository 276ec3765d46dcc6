# binaries of cfc903c
# Device call 4: the offload GPU test again, the configs against transformers, virtual workers
# with the device-side gradient sum, and --init-from a transformers-written Llama-3-8B shape
(DISTFLASH_GPU_TESTS=1 timeout 60 .dev/gpu_ops offload --test-threads 1 --nocapture > $OUT/p/gpu_ops_offload.log 2>&1)
CASES="qwen2:cpu llama_bias:cpu yarn:cpu dynamic:cpu mistral_window16:cpu qwen2:cuda llama_bias:cuda yarn:cuda" \
  CASE_TIMEOUT=60 OUT=$OUT/p timeout 240 bash bench/peers/config_parity.sh
SECTIONS="bench init" BENCH_RUNS="2:none 2:full" BENCH_ARGS="--repeats 2" BENCH_TIMEOUT=100 \
  INIT_TIMEOUT=80 OUT=$OUT/s timeout 330 bash bench/peers/startup_checks.sh

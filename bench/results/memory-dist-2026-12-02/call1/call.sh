#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/ of main with the layer backward freeing what
# it has read, the attention adapter freeing its head-major inputs before the relayouts back,
# and distattn21 merged (build_gpu_tests.sh, build_wheel.sh).
# 1. GPU tests: the counted estimate against the pool's peak (gpu_ops), the model's attention
#    on the GPU (gpu_model_attention), the binding's ranks on lent copies (gpu_attention).
# 2. dist_flash_attn: bench/peers/dist_binding.sh.
# 3. The recorded peaks for train::estimate's test: bench train, llama2-7b, 16K and 32K, remat
#    and layer; then 512K with 4 layers under --offload activations --checkpoint layer.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
LOG=$OUT/gpu_tests.log TESTS=gpu_ops TIMEOUT=150 bash bench/peers/gpu_tests.sh the_counted_estimate > /dev/null 2>&1; echo "gpu_ops count: exit $?"
cp $OUT/gpu_tests.log $OUT/gpu_ops.log
LOG=$OUT/gpu_tests.log TESTS=gpu_model_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_model_attention: exit $?"
cp $OUT/gpu_tests.log $OUT/gpu_model_attention.log
LOG=$OUT/gpu_tests.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh ranks_on_lent > /dev/null 2>&1; echo "gpu_attention ranks_on_lent: exit $?"
mv $OUT/gpu_tests.log $OUT/gpu_attention_ranks.log
grep -h "test result\|PASS\|FAIL\|panicked" $OUT/gpu_ops.log $OUT/gpu_model_attention.log $OUT/gpu_attention_ranks.log | tail -n 12
timeout 200 bash bench/peers/dist_binding.sh > $OUT/dist_binding.log 2>&1; echo "dist_binding: exit $?"; tail -n 2 $OUT/dist_binding.log
B="bench train --device cuda --preset llama2-7b --json"
Q="--warmup 1 --repeats 1"
for run in "16384 remat" "16384 layer" "32768 remat" "32768 layer"; do
  set -- $run
  timeout 90 .dev/distflash $B $Q --seq-len $1 --checkpoint $2 > $OUT/bench_$1_$2.json 2> $OUT/bench_$1_$2.err
  echo "$1 $2: exit $? $(grep -o '"step_secs":[0-9.]*\|"peak_memory_gib":[0-9.]*\|"estimated_memory_gib":[0-9.]*' $OUT/bench_$1_$2.json | paste -sd' ')"
done
timeout 260 .dev/distflash $B --layers 4 --seq-len 524288 --checkpoint layer --offload activations --warmup 0 --repeats 1 > $OUT/bench_524288_4layers.json 2> $OUT/bench_524288_4layers.err
echo "524288 4 layers: exit $? $(grep -o '"step_secs":[0-9.]*\|"peak_memory_gib":[0-9.]*\|"estimated_memory_gib":[0-9.]*' $OUT/bench_524288_4layers.json | paste -sd' ')"
tail -n 3 $OUT/bench_524288_4layers.err

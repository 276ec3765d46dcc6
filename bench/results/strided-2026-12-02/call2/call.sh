#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash of main with the strided kernels, and
# .dev/old/distflash of aeac854 (the head-major relayouts), both release builds.
# 1. The recorded peaks for train::estimate's test: bench train, llama2-7b, 16K and 32K, remat
#    and layer; then 512K with 4 layers under --offload activations --checkpoint layer.
# 2. Step time, old against new, alternated in this call: llama2-7b 16K and 64K remat.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
B="bench train --device cuda --preset llama2-7b --json"
Q="--warmup 1 --repeats 1"
field() { grep -o "\"$1\":[0-9.]*" "$2" | head -n 1 | cut -d: -f2; }
for run in "16384 remat" "16384 layer" "32768 remat" "32768 layer"; do
  set -- $run
  timeout 90 .dev/distflash $B $Q --seq-len $1 --checkpoint $2 > $OUT/bench_$1_$2.json 2> $OUT/bench_$1_$2.err
  echo "$1 $2: exit $? step $(field step_secs $OUT/bench_$1_$2.json) peak $(field peak_memory_gib $OUT/bench_$1_$2.json) estimated $(field estimated_memory_gib $OUT/bench_$1_$2.json)"
done
timeout 240 .dev/distflash $B --layers 4 --seq-len 524288 --checkpoint layer --offload activations --warmup 0 --repeats 1 > $OUT/bench_524288_4layers.json 2> $OUT/bench_524288_4layers.err
echo "524288 4 layers: exit $? step $(field step_secs $OUT/bench_524288_4layers.json) peak $(field peak_memory_gib $OUT/bench_524288_4layers.json) estimated $(field estimated_memory_gib $OUT/bench_524288_4layers.json)"
for seq in 16384 65536; do
  for bin in old new old new; do
    exe=.dev/distflash; [ $bin = old ] && exe=.dev/old/distflash
    timeout 120 $exe $B --warmup 1 --repeats 2 --seq-len $seq --checkpoint remat > $OUT/step_${seq}_$bin.json 2>/dev/null
    echo "$seq remat $bin: exit $? step $(field step_secs $OUT/step_${seq}_$bin.json) peak $(field peak_memory_gib $OUT/step_${seq}_$bin.json)"
  done
done

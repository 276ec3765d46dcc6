#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/ of main e00dd89 + the dO-in-16-bit change
# (build_gpu_tests.sh, build_wheel.sh), and .dev/old/distflash of aeac854 (head-major relayouts).
# 1. torch_binding.py's views check alone (its criterion fixed: gradients within one rounding).
# 2. bench attention, d128 at 16K and 64K, seq-major and head-major alternated twice (call 1's
#    16K forward differed by 15% between layouts, once).
# 3. The recorded peaks for train::estimate's test: bench train, llama2-7b, 16K and 32K, remat
#    and layer; then 512K with 4 layers under --offload activations --checkpoint layer.
# 4. Step time, old against new, alternated in this call: llama2-7b 16K (twice each), 64K remat.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
(source bench/peers/binding_env.sh && cd bench/peers && timeout 120 python3 -c "
import json, torch_binding as t
rows, ok = t.views()
print('views passed', ok)" ) > $R/views.log 2>&1; echo "views: exit $?"; tail -n 3 $R/views.log
for round in 1 2; do
  for layout in seq-major head-major; do
    timeout 60 .dev/distflash bench attention --device cuda --seqs 16384,65536 --head-dims 128 --layout $layout --json $R/attention_${layout}_$round.jsonl > /dev/null 2>&1
    echo "attention $layout round $round: exit $? $(grep -o '"seq":[0-9]*\|"fwd_tflops":[0-9.]*\|"bwd_tflops":[0-9.]*' $R/attention_${layout}_$round.jsonl | paste -sd' ')"
  done
done
B="bench train --device cuda --preset llama2-7b --json"
field() { grep -o "\"$1\":[0-9.]*" "$2" | head -n 1 | cut -d: -f2; }
for run in "16384 remat" "16384 layer" "32768 remat" "32768 layer"; do
  set -- $run
  timeout 90 .dev/distflash $B --warmup 1 --repeats 1 --seq-len $1 --checkpoint $2 > $R/bench_$1_$2.json 2> $R/bench_$1_$2.err
  echo "$1 $2: exit $? step $(field step_secs $R/bench_$1_$2.json) peak $(field peak_memory_gib $R/bench_$1_$2.json) estimated $(field estimated_memory_gib $R/bench_$1_$2.json)"
done
timeout 220 .dev/distflash $B --layers 4 --seq-len 524288 --checkpoint layer --offload activations --warmup 0 --repeats 1 > $R/bench_524288_4layers.json 2> $R/bench_524288_4layers.err
echo "524288 4 layers: exit $? step $(field step_secs $R/bench_524288_4layers.json) peak $(field peak_memory_gib $R/bench_524288_4layers.json) estimated $(field estimated_memory_gib $R/bench_524288_4layers.json)"
for run in "16384 old" "16384 new" "16384 old" "16384 new" "65536 old" "65536 new"; do
  set -- $run
  exe=.dev/distflash; [ $2 = old ] && exe=.dev/old/distflash
  timeout 100 $exe $B --warmup 1 --repeats 2 --seq-len $1 --checkpoint remat >> $R/step_$1_$2.json 2>/dev/null
  echo "$1 remat $2: exit $? step $(tail -n 1 $R/step_$1_$2.json | grep -o '"step_secs":[0-9.]*' | cut -d: -f2) peak $(tail -n 1 $R/step_$1_$2.json | grep -o '"peak_memory_gib":[0-9.]*' | cut -d: -f2)"
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

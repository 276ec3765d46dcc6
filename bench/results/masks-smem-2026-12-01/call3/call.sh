#!/usr/bin/env bash
# Device call (nvidia-h200): at 128K, the backward before (.dev/distflash-old, 03eeefb: mask test
# in the softmax loop) and after (.dev/distflash, 9372344: the test as a pass of its own) the
# change of issue 19, interleaved in one run with the causal reference measured three times;
# then the PyTorch binding (issue 21: errors, speed, argument errors, the example on bytes).
# Binaries from bench/peers/build_gpu_tests.sh + build_wheel.sh, carry [".dev"].
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
DOCS=$(python3 -c 'print(",".join(["8192"] * 16))')
run() {  # tag, binary, mask arguments
  local tag=$1 bin=$2; shift 2
  $bin bench attention --device cuda --seqs 131072 --head-dims 128 --heads 32 "$@" --json $OUT/t_$tag.jsonl > /dev/null 2>&1
  echo "$tag $(grep -o '"fwd_ms":[0-9.]*\|"bwd_ms":[0-9.]*' $OUT/t_$tag.jsonl | paste -sd' ')"
}
{
run causal_a .dev/distflash
run window_old .dev/distflash-old --window 4096
run window_new .dev/distflash --window 4096
run docs_old .dev/distflash-old --doc-lens $DOCS
run docs_new .dev/distflash --doc-lens $DOCS
run causal_b .dev/distflash
run window_new2 .dev/distflash --window 4096
run docs_new2 .dev/distflash --doc-lens $DOCS
run causal_c .dev/distflash-old
} | tee $OUT/timing.txt
cat $OUT/t_*.jsonl > $OUT/timing.jsonl && rm $OUT/t_*.jsonl
mkdir -p $OUT/binding
OUT=$OUT/binding SEQS=4096,16384,65536 timeout 300 bash bench/peers/torch_binding.sh > $OUT/binding/console.log 2>&1
echo "binding exit $?"; grep -i "pass\|fail\|example" $OUT/binding/console.log | tail -n 12
cd $OUT && tar czf binding.tgz binding && rm -rf binding

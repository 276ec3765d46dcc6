#!/usr/bin/env bash
# Device call (nvidia-h200), the session's last: binaries of the merged main (7645289) from
# bench/peers/build_gpu_tests.sh as .dev/, and of ac9cd5f (main before the shard16 merge) as
# .dev/old/distflash; carry [".dev"].
#  1. GPU tests: attention (the masked backward's pass, both kernel families' causal modules)
#     and the counted estimate against the GPU pool's own peak (issue 17)
#  2. 128K: causal, 8K documents, 4K window (issue 19's criterion), the causal reference twice
#  3. bench train 16K: 1 worker (its peak against the counted estimate), 2 virtual workers
#     --shard none / full, old binary and new, interleaved (issue 16); then the tiny-shape
#     training under every --shard on 2 and 3 virtual workers against --shard none
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
LOG=$OUT/gpu_tests.log TESTS="gpu_attention gpu_model_attention" timeout 200 bash bench/peers/gpu_tests.sh; echo "attention tests exit $?"
LOG=$OUT/gpu_tests.log TESTS=gpu_ops timeout 100 bash bench/peers/gpu_tests.sh counted_estimate; echo "counted estimate exit $?"
LOG=$OUT/gpu_tests.log TESTS=gpu_ops timeout 60 bash bench/peers/gpu_tests.sh virtual_workers; echo "virtual-worker collectives exit $?"
grep -E "test result|FAILED|panicked|PASS|FAIL" $OUT/gpu_tests.log | head -16
DOCS=$(python3 -c 'print(",".join(["8192"] * 16))')
run() {  # tag, mask arguments
  local tag=$1; shift
  .dev/distflash bench attention --device cuda --seqs 131072 --head-dims 128 --heads 32 "$@" --json $OUT/t_$tag.jsonl > /dev/null 2>&1
  echo "$tag $(grep -o '"fwd_ms":[0-9.]*\|"bwd_ms":[0-9.]*' $OUT/t_$tag.jsonl | paste -sd' ')"
}
{ run causal_a; run window; run docs; run causal_b; } | tee $OUT/timing.txt
cat $OUT/t_*.jsonl > $OUT/timing.jsonl && rm $OUT/t_*.jsonl
B="bench train --device cuda --preset llama2-7b --seq-len 16384 --checkpoint remat --json"
for run in "new 1 none" "old 2 none" "new 2 none" "old 2 full" "new 2 full" "new 2 none" "new 2 full"; do
  set -- $run; bin=.dev/distflash; [ "$1" = old ] && bin=.dev/old/distflash
  timeout 120 $bin $B --workers $2 --shard $3 > $OUT/run.json 2> $OUT/run.err; rc=$?
  { echo "=== $1 workers $2 shard $3: exit $rc"; cat $OUT/run.json $OUT/run.err; } >> $OUT/bench_train.log
  echo "$1 $2 $3: exit $rc $(grep -o '"step_secs":[0-9.]*\|"peak_memory_gib":[0-9.]*\|"estimated_memory_gib":[0-9.]*' $OUT/run.json | paste -sd' ')"
done
rm -f $OUT/run.json $OUT/run.err
mkdir -p $OUT/shard
OUT=$OUT/shard SECTIONS=shard timeout 150 bash bench/peers/startup_checks.sh > /dev/null 2>&1; echo "shard section exit $?"
grep -iE "pass|fail|exit" $OUT/shard/startup.log | tail -n 8
cd $OUT && tar czf shard.tgz shard && rm -rf shard

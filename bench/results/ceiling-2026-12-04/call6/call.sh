#!/usr/bin/env bash
# Device call 6 (nvidia-h200), carry [".dev"]. Builds:
#   v24 = .dev/v24/ (79c6d14)
#   v25 = .dev/     v24, with the narrow backward handing each staged dQ share to the reducing
#                   warp (fence, barrier arrival) in the next tile's first turn instead of right
#                   after its stores: call 5's profile had 5.8% of the samples on that fence.
# 1. gpu_timing attention, v24 / v25 alternated twice: head dims 64, 96, 128 at 8K and 32K; the
#    deterministic backward at d128 32K once each;
# 2. on v25: gpu_attention (default: every case; deterministic: the fast path and the repeats),
#    gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
pack() { tar czf $OUT/runs.tgz -C $OUT runs; }
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v25) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in v24 v25; do
    timeout 60 $(tbin $v) attention --seqs 8192,32768 --head-dims 64,96,128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round: exit $? $(sum $R/a_${v}_$round.jsonl)"
  done
done
for v in v24 v25; do
  DISTFLASH_TUNING=deterministic=true timeout 40 $(tbin $v) attention --seqs 32768 --head-dims 128 --json $R/det_${v}.jsonl > /dev/null 2>$R/det_${v}.err
  echo "deterministic $v: exit $? $(sum $R/det_${v}.jsonl)"
done
pack
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (v25): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
pack
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=90 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (v25): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_ops.log TESTS="gpu_model_attention" TIMEOUT=40 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_model_attention (v25): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 2
pack && rm -rf $R

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Builds (kernels only differ):
#   base = .dev/base/ (main 88cc876, kernels v22)
#   st   = .dev/st/   call 1's st: at step k of a box each thread stores its tile k ^ (g % 4)
#                     (two levels of selects)
#   st1  = .dev/      the same conflict-free stores with one level: threads of odd rows g store
#                     tile k ^ 2 (rows 0..3 then cover chunk pairs k, k^2, k^1, k^3)
# 1. gpu_timing attention, base / st / st1 alternated twice: d64 8K and 32K, d96, d128, d192,
#    d256 at 32K;
# 2. every GPU test on st1: gpu_attention (default: every case; deterministic: the fast path and
#    the repeats), gpu_ops, gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in st1) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in base st st1; do
    timeout 60 $(tbin $v) attention --seqs 8192 --head-dims 64 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    timeout 120 $(tbin $v) attention --seqs 32768 --head-dims 64,96,128,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round: exit $? $(sum $R/a_${v}_$round.jsonl) $(sum $R/b_${v}_$round.jsonl)"
  done
done
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (st1): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (st1): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (st1): exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

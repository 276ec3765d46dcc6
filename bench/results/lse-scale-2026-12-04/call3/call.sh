#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]. Builds:
#   v26 = .dev/v26/ (as in call 2)
#   v28 = .dev/     v26 plus call 2's lazy rescale in the wgmma forward, with the decision made
#                    per row: a row moves its maximum only when it grew by more than 8 (base 2),
#                    so its exponentials wait only for its own maximum (v27 voted across the warp
#                    first, which put the vote between the maxima and the exponentials); O's
#                    multiplies are skipped warp by warp after a vote that runs beside the
#                    exponentials.
# Prediction, written before the call: call 2's v27 lost 2-3% at d128 (forward 632 -> 613 at
# 32K) and gained 3.5% at d64; v28 should keep v27's gains and lose none of it at d128: d128
# forward +1-4%, d64 +3-5%.
# 1. gpu_timing attention, v26 / v28 alternated twice: d128 at 8K, 32K and 128K; d64, d96, d192,
#    d256 at 32K;
# 2. every GPU test on v28: gpu_attention (default: every case), gpu_ops, gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v28) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in v26 v28; do
    timeout 100 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $(tbin $v) attention --seqs 32768 --head-dims 64,96,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (v28): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (v28): exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

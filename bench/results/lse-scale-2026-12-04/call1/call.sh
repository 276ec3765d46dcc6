#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Builds:
#   v24 = .dev/v24/ (main cb2294f's kernels: PTX identical to 79c6d14, timed in
#                    ceiling-2026-12-04 calls 3-5)
#   v26 = .dev/     v24 plus: the loading warp puts each query tile's LSE into base 2 (+inf for
#                    rows that see no key) and D times the softmax scale as it stages them
#                    (form_row_vectors); the computing warpgroups' dS^T comes out scaled
#                    (scores_grad: P*(scale*dP - scale*D), one FFMA where there was an FADD), so
#                    dQ's staging and dK's output drop their multiplies. d128 causal backward loop:
#                    901 -> 778 SASS instructions (one 4-byte reload per tile).
# Prediction, written before the call: d128 backward +4-6% (about 80 of ~620 executed
# instructions a tile go, and v24 took +14% for ~235); d64 and d96 +3-5%; d192 and d256 +1-3%
# (more products per exponential); the forward unchanged.
# 1. gpu_timing attention, v24 / v26 alternated twice: d128 at 8K, 32K and 128K; d64, d96, d192,
#    d256 at 32K;
# 2. every GPU test on v26: gpu_attention (default: every case; deterministic: the fast path and
#    the repeats), gpu_ops, gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v26) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in v24 v26; do
    timeout 100 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $(tbin $v) attention --seqs 32768 --head-dims 64,96,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (v26): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (v26): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (v26): exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Builds:
#   v30 = .dev/v30/ (main a820dc7)
#   v31 = .dev/     v30 plus: the backward's dK and dV leave through shared memory
#                    (kv_grads_out, backward_wgmma.cuh): staged with a bank-conflict-free swizzle
#                    over K's tile and the stages after it, then written in 16-byte vectors
#                    along whole rows (16-bit), or added by red.global.add.v4.f32 (GQA's f32
#                    accumulators), where each thread stored 64 pairs of 4 (or 8) bytes, 8 rows
#                    a warp-wide store; the reducing warp's last wait is for its reductions'
#                    reads only. Both wgmma backward kernels (head dims 64-128 and 192-256). SASS
#                    of the d128 causal loop: 778 -> 777 instructions, no spill (v30: 4 bytes).
# Prediction, written before the call: call 1's trace put the old stores at ~10K cycles a CTA
# (two query tiles' time); if ~8K of them go, the d128 backward gains ~2.5% at 8K (15.5 CTAs an
# SM), ~1.3% at 16K, ~0.6% at 32K, ~0.2% at 128K; d64 more at 8K (+3-4%: half the work a tile);
# d192 and d256 (64-key CTAs, twice as many) +2-3% at 8K, ~1% at 32K. The forward unchanged.
# 1. gpu_timing attention, v30 / v31 alternated twice: d128 at 8K, 16K, 32K and 128K; d64, d96,
#    d192, d256 at 8K and 32K;
# 2. every GPU test on v31: gpu_attention (default: every case; deterministic: the fast path and
#    the repeats), gpu_ops, gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v31) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in v30 v31; do
    timeout 100 $(tbin $v) attention --seqs 8192,16384,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $(tbin $v) attention --seqs 8192,32768 --head-dims 64,96,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (v31): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (v31): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (v31): exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]. Builds:
#   base = .dev/base/ (call 1's: main 556cfae plus the backward prologue in one place, = kernels v23)
#   v24  = .dev/      the same plus: wgmma descriptors stepped by one add from a base
#                     (wg_desc_at), the warpgroup index made warp-uniform (warpgroup_index), the
#                     causal module's exponentials in two copies chosen once a tile (exp_scores),
#                     LSE and D read as pairs. d128 causal backward: loop 1015 → 901 SASS
#                     instructions (~855 → ~620 executed on tiles off the diagonal), no R2UR and
#                     no spill left in it.
# 1. gpu_timing attention, base / v24 alternated twice: d128 at 8K, 32K and 128K; d64, d96, d192,
#    d256 at 32K;
# 2. every GPU test on v24: gpu_attention (default: every case; deterministic: the fast path and
#    the repeats), gpu_ops, gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v24) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in base v24; do
    timeout 100 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $(tbin $v) attention --seqs 32768 --head-dims 64,96,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (v24): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (v24): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (v24): exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

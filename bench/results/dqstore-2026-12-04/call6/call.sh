#!/usr/bin/env bash
# Device call 6 (nvidia-h200), carry [".dev"]. Build: .dev/ (build_gpu_tests.sh) at d7980e4: the
# wide backward's buffers passed from the host as #defines (WideBackward), PTX byte-identical to
# c7940b6's for all 48 sm_90a variants (compared offline). Checks the host side on the GPU:
# 1. gpu_attention's fast path against the f64 oracle, every case (head dims 64-256), default
#    and deterministic, and the deterministic repeats;
# 2. a timing of d192 and d256 at 32K (calls 2-3: 405-407 and 442-443).
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
LOG=$R/gpu_attention_fast.log TESTS=gpu_attention TIMEOUT=120 bash bench/peers/gpu_tests.sh fast_path_matches > /dev/null 2>&1; echo "gpu_attention fast_path: exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_fast.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=120 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats: exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
timeout 40 .dev/gpu_timing attention --seqs 32768 --head-dims 192,256 --json $R/wide.jsonl > /dev/null 2>$R/wide.err; echo "d192/256: exit $? $(sum $R/wide.jsonl)"
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

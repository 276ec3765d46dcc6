#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]. Builds (gpu_timing):
#   base = .dev/base/ (main cd2174d), v22 = .dev/v22/ (call 3's),
#   one  = .dev/ (build_gpu_tests.sh): v22 with head dim 192's tile loop as one copy (the first
#          tile peeled only where dQ runs late, at 256): call 3 had 192 2-2.5% under base
# 1. gpu_attention (one): the fast path against the f64 oracle, every case; deterministic
#    repeats (9 cases);
# 2. gpu_timing attention, base / v22 / one alternated twice: d192 at 8K and 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in one) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=120 bash bench/peers/gpu_tests.sh fast_path_matches > /dev/null 2>&1; echo "gpu_attention fast path (one): exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_default.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=120 bash bench/peers/gpu_tests.sh repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det repeats (one): exit $?"
grep -h "test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for round in 1 2; do
  for v in base v22 one; do
    timeout 60 $(tbin $v) attention --seqs 8192,32768 --head-dims 192 --json $R/w_${v}_$round.jsonl > /dev/null 2>$R/w_${v}_$round.err
    echo "d192 $v round $round: exit $? $(sum $R/w_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

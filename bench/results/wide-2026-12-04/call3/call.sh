#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]. Builds:
#   base = .dev/base/ (main cd2174d: the wide backward computes each tile's dQ after its dK, dV)
#   v22  = .dev/ (build_gpu_tests.sh, as committed): dQ one tile late at head dim 256 only
#          (call 2's `late`, PTX the same but for the loop bound's arithmetic); at 192 call 2's
#          `base` order with the first tile peeled and Q released before dQ (ptxas: no spill)
# 1. gpu_attention (v22): the fast path against the f64 oracle, every case; deterministic: the
#    fast path and the repeats (9 cases, 192 and 256 among them);
# 2. gpu_timing attention, base / v22 alternated: d192 and d256 at 8K and 32K;
# 3. issue 18's head dims 64-256 at 8K and 32K beside SDPA (FA2, cuDNN); GQA 32/8 at d192 and
#    d256; the deterministic rates at d192 and d256; the blocks over 4 workers at d256 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v22) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches > /dev/null 2>&1; echo "gpu_attention fast path (v22): exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_default.log | tail -n 4
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (v22): exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_det.log | tail -n 4
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for v in base v22; do
  timeout 90 $(tbin $v) attention --seqs 8192,32768 --head-dims 192,256 --json $R/w_$v.jsonl > /dev/null 2>$R/w_$v.err
  echo "d192/256 $v: exit $? $(sum $R/w_$v.jsonl)"
done
D=.dev/distflash
mkdir -p $R/hd $R/gqa $R/extra
timeout 90 $D bench attention --device cuda --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "hd ours: exit $?"
timeout 150 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "hd sdpa: exit $?"
$D bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md
timeout 60 $D bench attention --device cuda --seqs 8192,32768 --head-dims 192,256 --kv-heads 8 --json $R/gqa/ours.jsonl > $R/gqa/ours.out 2>&1; echo "gqa ours: exit $?"
timeout 90 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 192,256 --kv-heads 8 --json $R/gqa/sdpa.jsonl > $R/gqa/sdpa.out 2>&1; echo "gqa sdpa: exit $?"
$D bench report --results $R/gqa --out $R/gqa/RESULTS.md && grep "^| [0-9]" $R/gqa/RESULTS.md
timeout 60 $D bench attention --device cuda --deterministic --seqs 8192,32768 --head-dims 192,256 --json $R/extra/det.jsonl > $R/extra/det.log 2>&1; echo "det d192/d256: exit $? $(sum $R/extra/det.jsonl)"
timeout 40 $D bench attention --device cuda --seqs 32768 --head-dims 256 --blocks 4 --json $R/extra/blocks4.jsonl > $R/extra/blocks4.log 2>&1; echo "blocks 4 d256: exit $?"
grep -h "block" $R/extra/blocks4.log | head -n 6
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

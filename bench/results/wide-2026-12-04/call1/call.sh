#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Builds:
#   v21  = .dev/v21/gpu_timing (main 906a58a, kernels v21: head dims 192 and 256 on mma.sync)
#   wide = .dev/ (build_gpu_tests.sh): head dims 192 and 256 on wgmma (the forward with 64-key
#          tiles; the wide backward, backward_wgmma_wide.cu); the narrow backward refactored
#          onto backward_wgmma.cuh (its PTX changed: dSᵀ addresses by XOR, d128 spill 52 -> 40)
# 1. a first timing of wide at d256 and d192, 8K (a hang shows as exit 124);
# 2. gpu_attention (wide): every case against the f64 oracle; deterministic oracle and repeats;
# 3. gpu_timing attention, v21 / wide alternated twice: d128 8K, 32K, 128K; d192 and d256 8K, 32K;
# 4. SDPA (FA2, cuDNN) at d192 and d256, 8K and 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in wide) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
timeout 60 .dev/gpu_timing attention --seqs 8192 --head-dims 256,192 --json $R/first.jsonl > $R/first.out 2>&1; echo "first wide: exit $? $(sum $R/first.jsonl)"; tail -n 3 $R/first.out | cut -c1-300
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_default.log | tail -n 12
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_det.log | tail -n 6
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for round in 1 2; do
  for v in v21 wide; do
    timeout 60 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 90 $(tbin $v) attention --seqs 8192,32768 --head-dims 192,256 --json $R/w_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d192/256 $v round $round: exit $? $(sum $R/w_${v}_$round.jsonl)"
  done
done
timeout 90 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 192,256 --json $R/sdpa.jsonl > $R/sdpa.out 2>&1; echo "sdpa: exit $?"
python3 -c "
import json
for r in map(json.loads, open('$R/sdpa.jsonl')): print(r['impl'], 'd%d %dK' % (r['head_dim'], r['seq']//1024), 'fwd %.0f bwd %.0f fwdbwd %.0f' % (r['fwd_tflops'], r['bwd_tflops'], r.get('fwdbwd_tflops', 0)))" 2>&1 | head -12
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

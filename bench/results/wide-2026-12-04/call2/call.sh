#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Builds:
#   base = .dev/base/ (main cd2174d, kernels v22 as first committed: the wide backward computes
#          each tile's dQ after its dK and dV)
#   late = .dev/ (build_gpu_tests.sh): the wide backward with dQ one tile late: warpgroup 1's
#          share beside warpgroup 0's Sᵀ (before dPᵀ, which then runs under the exponentials),
#          warpgroup 0's beside its dV while warpgroup 1 forms dSᵀ; two dSᵀ tiles; the first
#          tile peeled (ptxas: no spill at 192 or 256, was 8-16 and 48-60 bytes)
# 1. a first timing of late at d256 and d192, 8K (a hang shows as exit 124);
# 2. gpu_attention (late): every case against the f64 oracle; deterministic oracle and repeats;
# 3. gpu_timing attention, base / late alternated twice: d192 and d256 at 8K and 32K;
# 4. PyTorch's 2x criterion at d192 and d256 (late): `attention --check --save` on three
#    shapes each, then check_against_torch.py (float64 torch beside SDPA's own 16-bit error);
# 5. gpu_ops and gpu_model_attention (late; the model's ops and attention adapter).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in late) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
timeout 60 .dev/gpu_timing attention --seqs 8192 --head-dims 256,192 --json $R/first.jsonl > $R/first.out 2>&1; echo "first late: exit $? $(sum $R/first.jsonl)"
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (late): exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_default.log | tail -n 8
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (late): exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:\|Error" $R/gpu_attention_det.log | tail -n 4
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for round in 1 2; do
  for v in base late; do
    timeout 90 $(tbin $v) attention --seqs 8192,32768 --head-dims 192,256 --json $R/w_${v}_$round.jsonl > /dev/null 2>$R/w_${v}_$round.err
    echo "d192/256 $v round $round: exit $? $(sum $R/w_${v}_$round.jsonl)"
  done
done
for d in 192 256; do
  for shape in "1 8 2 1000 bf16" "4 4 1 777 fp16" "1 4 4 901 bf16 --doc-lens 300,1,400,200 --global 3"; do
    set -- $shape
    f=/tmp/ours_${d}_$1_$5.safetensors
    timeout 120 .dev/distflash attention --device cuda --head-dim $d --workers $1 --heads $2 --kv-heads $3 --seq-len $4 --dtype $5 "${@:6}" --check --save $f --json > $R/check_${d}_$1_$5.json 2>&1
    echo "check d=$d workers=$1 heads=$2/$3 seq=$4 $5 ${*:6}: exit $? $(grep -o '"passed": [a-z]*' $R/check_${d}_$1_$5.json)"
    if [ $# -eq 5 ]; then timeout 120 python3 bench/peers/check_against_torch.py $f > $R/torch_${d}_$1_$5.log 2>&1; echo "  torch: exit $? $(grep -o '"pass": [a-z]*' $R/torch_${d}_$1_$5.log), worst ratio $(grep -o '"ratio": [0-9.e+-]*' $R/torch_${d}_$1_$5.log | awk '{print $2}' | sort -g | tail -n 1)"; fi
  done
done
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention (late): exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

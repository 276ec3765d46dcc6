#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Build: .dev/ (build_gpu_tests.sh) of main 556cfae
# plus the backward prologue in one place (bwd_cta also forms BwdHead and the tensor maps'
# head and batch; PTX differs from 556cfae's by two moved instructions per variant).
# 1. The ceiling of the products the kernels are built of: bench/peers/wgmma_rates.cu (each
#    m64nNk16 shape alone and the d128 backward's mix of five products, back to back), beside
#    PyTorch's bf16 GEMM (8192³, random data), twice each;
# 2. every GPU test on the build: gpu_attention (default: every case; deterministic: the fast
#    path and the repeats), gpu_ops, gpu_model_attention;
# 3. the deterministic backward's layout question (v23: d256 32K at 245 seq-major in
#    `bench attention`, 270 head-major in gpu_timing): `bench attention --deterministic` at d256
#    and d128 32K, seq-major and head-major alternated twice, and the default backward in both.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
gemm() { python3 -c "
import torch
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
for _ in range(3): a @ b
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): a @ b
e.record(); torch.cuda.synchronize()
print('{\"case\": \"torch_gemm_8192\", \"ms\": %.3f, \"tflops\": %.1f}' % (s.elapsed_time(e) / 10, 2 * 8192**3 / (s.elapsed_time(e) / 10 * 1e-3) / 1e12))
"; }
nvcc -gencode arch=compute_90a,code=sm_90a -O3 -std=c++17 -o /tmp/wgmma_rates bench/peers/wgmma_rates.cu > $R/nvcc.log 2>&1; echo "nvcc: exit $?"
for round in 1 2; do
  gemm >> $R/rates_$round.jsonl
  timeout 60 /tmp/wgmma_rates >> $R/rates_$round.jsonl 2>&1
  echo "rates round $round: exit $? $(python3 -c "
import json
for r in map(json.loads, open('$R/rates_$round.jsonl')): print('%s %.0f;' % (r['case'], r['tflops']), end=' ')")"
done
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_default.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats: exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
LOG=$R/gpu_ops.log TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_ops.out 2>&1; echo "gpu_ops, gpu_model_attention: exit $?"; cat $R/gpu_ops.out
grep -h "test result\|FAIL\|panicked" $R/gpu_ops.log | tail -n 4
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
for round in 1 2; do
  for layout in seq-major head-major; do
    timeout 90 .dev/distflash bench attention --seqs 32768 --head-dims 256,128 --layout $layout --deterministic --json $R/det_${layout}_$round.jsonl > /dev/null 2>$R/det_${layout}_$round.err
    echo "deterministic $layout round $round: exit $? $(sum $R/det_${layout}_$round.jsonl)"
  done
done
for layout in seq-major head-major; do
  timeout 90 .dev/distflash bench attention --seqs 32768 --head-dims 256,128 --layout $layout --json $R/default_${layout}.jsonl > /dev/null 2>$R/default_${layout}.err
  echo "default $layout: exit $? $(sum $R/default_${layout}.jsonl)"
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

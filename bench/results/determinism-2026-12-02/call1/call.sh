#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]: .dev/ built by bench/peers/build_gpu_tests.sh
# from this change (the pairing variant removed, the backward's dV/dQ/dK reordered, the
# deterministic backward). Correctness only:
# 1. gpu_attention with the default kernels (every head dim, masks, blocks, lent memory, ranks,
#    and the_deterministic_backward_repeats_to_the_bit, which opens its own deterministic
#    backend);
# 2. gpu_attention again with every backend deterministic (DISTFLASH_TUNING=deterministic=true);
# 3. gpu_model_attention and gpu_ops (the model's attention adapter and the ops).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for v in default det; do
  case $v in default) T="";; det) T=deterministic=true;; esac
  DISTFLASH_TUNING=$T LOG=$R/gpu_attention_$v.log TESTS=gpu_attention TIMEOUT=260 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention $v: exit $?"
  grep -h "passed: worst\|test result\|FAIL\|panicked\|three runs\|Error\|error:" $R/gpu_attention_$v.log | tail -n 24
done
LOG=$R/gpu_model_ops.log TESTS="gpu_model_attention gpu_ops" TIMEOUT=150 bash bench/peers/gpu_tests.sh; echo "model+ops: exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_model_ops.log | tail -n 6

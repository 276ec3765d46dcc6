#!/usr/bin/env bash
# Device call (nvidia-h200), binaries and wheel of the commit in the README built here by
# bench/peers/build_gpu_tests.sh and bench/peers/build_wheel.sh, carry [".dev"]:
#   the GPU tests of the merged tree (masks, lent memory, offloaded moments), --offload optimizer
#   at 64K (llama2-7b, AdamW), and the PyTorch binding (torch_binding.sh).
set -u
export PATH=/opt/torch/.venv/bin:$PATH
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt
TIMEOUT=150 bash bench/peers/gpu_tests.sh
mkdir -p $OUT/offload
OUT=$OUT/offload SECTIONS=64k timeout 240 bash bench/peers/offload_optimizer.sh > $OUT/offload/console.log 2>&1
echo "offload exit $?"; cat $OUT/offload/summary.jsonl
mkdir -p $OUT/binding
OUT=$OUT/binding SEQS=4096,16384,65536 timeout 200 bash bench/peers/torch_binding.sh > $OUT/binding/console.log 2>&1
echo "binding exit $?"; tail -n 5 $OUT/binding/console.log
cd $OUT && tar czf offload.tgz offload && tar czf binding.tgz binding && rm -rf offload binding

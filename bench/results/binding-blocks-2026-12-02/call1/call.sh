#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash-*.whl of 1f5cb81 (build_wheel.sh).
# The binding's checks with masks (errors, correctness causal and masked against float64 SDPA
# beside 16-bit SDPA with the same explicit mask, the transformers LLaMA), then where its time
# goes at 4K and 16K (torch.profiler: kernels by name against CUDA-event time).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache PYTHONUNBUFFERED=1
python3 -m pip install --quiet --disable-pip-version-check --no-deps --target /tmp/distflash-py .dev/distflash-*.whl
export PYTHONPATH=/tmp/distflash-py
cd bench/peers
timeout 300 python3 torch_binding.py --out $OUT/torch_binding.json > $OUT/torch_binding.log 2>&1; echo "torch_binding exit $?"
tail -n 2 $OUT/torch_binding.log
timeout 200 python3 binding_profile.py --seqs 4096,16384 --out $OUT/binding_profile.json > $OUT/binding_profile.log 2>&1; echo "profile exit $?"
cut -c1-600 $OUT/binding_profile.log

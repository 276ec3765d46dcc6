#!/usr/bin/env bash
# On the GPU machine (CUDA, PyTorch; no Rust): `distflash.dist_flash_attn` checked in one device
# call (dist_binding.py: virtual ranks on one GPU, a one-process torch.distributed group, the
# refusals). Needs .dev/distflash-*.whl (build_wheel.sh) carried over; from the repository root
# with $OUT set:
#   bash bench/peers/dist_binding.sh
# Writes $OUT/dist_binding.json; prints a JSON line per check and a last line
# "dist_binding: virtual ranks PASS, torch.distributed PASS, errors PASS"; exit status 1 if
# a check failed.
set -euo pipefail
source bench/peers/binding_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 bench/peers/dist_binding.py --out "$OUT/dist_binding.json"

#!/usr/bin/env bash
# On the GPU machine (CUDA, PyTorch, transformers; no Rust): masks through distflash's
# transformers integration checked in one device call (hf_mask_parity.py: packed documents from
# position ids and from cu_seq_lens, Mistral's sliding window, both, a cached decode, the
# refusals; tiny models against transformers' SDPA). Needs .dev/distflash-*.whl (build_wheel.sh)
# carried over; from the repository root with $OUT set:
#   bash bench/peers/hf_mask_parity.sh
# Writes $OUT/hf_mask_parity.json; prints a JSON line per case and a last PASSED/FAILED line;
# exit status 1 if a check failed.
set -euo pipefail
source bench/peers/binding_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
python3 bench/peers/hf_mask_parity.py --out "$OUT/hf_mask_parity.json"

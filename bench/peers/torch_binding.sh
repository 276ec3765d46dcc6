#!/usr/bin/env bash
# On the GPU machine (CUDA, PyTorch, transformers; no Rust): the Python binding checked and
# timed in one device call. Needs .dev/distflash-*.whl (build_wheel.sh) and .dev/distflash
# (build_gpu_tests.sh) carried over; run from the repository root with $OUT set:
#   bash bench/peers/torch_binding.sh
# Writes $OUT/distflash.jsonl (`distflash bench attention` at the speed check's shapes),
# $OUT/torch_binding.json (every figure and verdict, see torch_binding.py),
# $OUT/finetune.jsonl (python/examples/finetune_llama.py's losses) and $OUT/dist_binding.json
# (dist_binding.py's checks of dist_flash_attn, also runnable alone: dist_binding.sh); exit
# status 1 if a check failed. SEQS / DIMS choose the timed shapes (batch 1, 32 heads).
set -euo pipefail
BIN=${BIN:-.dev/distflash}
SEQS=${SEQS:-4096,16384,65536}
DIMS=${DIMS:-128,64}
source bench/peers/binding_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
status=0
"$BIN" bench attention --device cuda --seqs "$SEQS" --head-dims "$DIMS" --json "$OUT/distflash.jsonl" || status=1
python3 bench/peers/torch_binding.py --bench "$OUT/distflash.jsonl" --out "$OUT/torch_binding.json" || status=1
# The example: a tiny LLaMA fine-tuned on the repository's Markdown as bytes, 300 steps: its
# loss starts at ln 512 = 6.2 and must end under 3 (the mean of the last 20 steps).
python3 python/examples/finetune_llama.py --steps 300 --json "$OUT/finetune.jsonl" | tail -n 3 || status=1
python3 - "$OUT/finetune.jsonl" <<'PY' || status=1
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
tail = sum(losses[-20:]) / len(losses[-20:])
print(f"example: loss {losses[0]:.3f} -> {tail:.3f} (mean of the last 20 steps) {'PASS' if tail < 3 else 'FAIL'}")
sys.exit(0 if tail < 3 else 1)
PY
# dist_flash_attn over virtual ranks and a one-process torch.distributed group.
python3 bench/peers/dist_binding.py --out "$OUT/dist_binding.json" | tail -n 1 || status=1
exit $status

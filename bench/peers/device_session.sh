#!/usr/bin/env bash
# One device call: correctness (f64 reference, PyTorch comparison), then timing of distflash's
# kernels and of PyTorch SDPA on the same shapes. Run from the repository root on the GPU
# machine with the release example binary at $BIN (default ./.dev/cuda_attn) and $OUT set.
#   BENCH_SEQS=4096,16384,65536 BWD_WARPS="8 4" bash bench/peers/device_session.sh
set -u
BIN=${BIN:-./.dev/cuda_attn}
PEERS=${PEERS:-bench/peers}
SEQS=${BENCH_SEQS:-4096,16384,65536}
DIMS=${BENCH_DIMS:-128,64}
WARPS=${BWD_WARPS:-8 4}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
export PYTHONUNBUFFERED=1
step() { echo "=== $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
for w in $WARPS; do
  step "check, bwd warps $w"
  timeout 120 "$BIN" --bwd-warps "$w" check 2>&1 | tee -a "$OUT/check.log"
done
for dt in bf16 fp16; do
  step "dump + torch check $dt"
  timeout 60 "$BIN" dump --out "/tmp/ours_$dt.safetensors" --dtype "$dt" --seq 1000 --heads 8 --kv-heads 2 \
    && timeout 120 python3 "$PEERS/check_against_torch.py" "/tmp/ours_$dt.safetensors" 2>&1 | tee -a "$OUT/torch_check.log"
done
for w in $WARPS; do
  step "bench distflash, bwd warps $w"
  timeout 300 "$BIN" --bwd-warps "$w" bench --seqs "$SEQS" --head-dims "$DIMS" --json "$OUT/distflash_w$w.jsonl" 2>&1 | tail -n 20
done
step "bench sdpa"
timeout 300 python3 "$PEERS/sdpa_bench.py" --seqs "$SEQS" --head-dims "$DIMS" --json "$OUT/sdpa.jsonl" 2>&1 | tail -n 20

#!/usr/bin/env bash
# One device call for re-tuning the attention kernels: correctness of each kernel variant (the
# GPU test tests/gpu_attention.rs against the f64 reference, and PyTorch float64 on a saved
# run), then the variants' timing (examples/gpu_timing.rs) and PyTorch SDPA's on the same
# shapes. A variant is a DISTFLASH_TUNING value (tests/gpu_common/tuning.rs); VARIANTS lists
# them, space-separated, "default" for the built-in choice. Run from the repository root with
# the binaries built by bench/peers/build_gpu_tests.sh and $OUT set (carry [".dev"]):
#   bash bench/peers/device_session.sh
#   BENCH_SEQS=16384 VARIANTS="default bwd-warps=4" bash bench/peers/device_session.sh
# Files in $OUT: gpu_tests.log, torch_check.log, distflash_<variant>.jsonl, sdpa.jsonl.
set -u
BIN_DIR=${BIN_DIR:-.dev}
PEERS=$(dirname "$0")
SEQS=${BENCH_SEQS:-4096,16384,65536}
DIMS=${BENCH_DIMS:-128,64}
VARIANTS=${VARIANTS:-default}
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
export PYTHONUNBUFFERED=1
step() { echo "=== $*"; }
tuning() { [ "$1" = default ] && echo "" || echo "$1"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
for v in $VARIANTS; do
  step "check, variant $v"
  DISTFLASH_TUNING=$(tuning "$v") BIN_DIR=$BIN_DIR TESTS=gpu_attention bash "$PEERS/gpu_tests.sh"
done
for dt in bf16 fp16; do
  step "save + torch check $dt"
  timeout 60 "$BIN_DIR/distflash" attention --device cuda --dtype "$dt" --seq-len 1000 --heads 8 --kv-heads 2 \
    --head-dim 128 --save "/tmp/ours_$dt.safetensors" > /dev/null \
    && timeout 120 python3 "$PEERS/check_against_torch.py" "/tmp/ours_$dt.safetensors" 2>&1 | tee -a "$OUT/torch_check.log"
done
for v in $VARIANTS; do
  step "bench distflash, variant $v"
  DISTFLASH_TUNING=$(tuning "$v") timeout 300 "$BIN_DIR/gpu_timing" attention --seqs "$SEQS" --head-dims "$DIMS" \
    --json "$OUT/distflash_$(echo "$v" | tr -c 'a-z0-9\n' _).jsonl" 2>&1 | tail -n 20
done
step "bench sdpa"
timeout 300 python3 "$PEERS/sdpa_bench.py" --seqs "$SEQS" --head-dims "$DIMS" --json "$OUT/sdpa.jsonl" 2>&1 | tail -n 20

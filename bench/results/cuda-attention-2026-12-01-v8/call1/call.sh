# Kernels v8 (first call): correctness of both new variants and of the mma.sync kernels (not run
# on a GPU since load_tile changed), then base (v7, f11c4a8) / fwd (P·V one tile late) /
# fb (fwd + per-warpgroup dQ) against SDPA in the same call.
set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for v in fwd fb; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 150 .dev/$v/cuda_attn check > $OUT/check_$v.log 2>&1; echo "$v check exit $?"; tail -1 $OUT/check_$v.log
done
DISTFLASH_CACHE_DIR=/tmp/dc_sync timeout 150 .dev/fb/cuda_attn --fwd-wgmma false --bwd-wgmma false check > $OUT/check_fb_mma_sync.log 2>&1; echo "fb mma.sync check exit $?"; tail -1 $OUT/check_fb_mma_sync.log
for v in base fwd fb; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 150 .dev/$v/cuda_attn bench --seqs 16384,65536 --head-dims 128,64 --json $OUT/ab_$v.jsonl > $OUT/ab_$v.log 2>&1; echo "$v bench rc $?"
done
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
timeout 200 $PY bench/peers/sdpa_bench.py --seqs 16384,65536 --head-dims 128,64 --json $OUT/sdpa.jsonl > $OUT/sdpa.log 2>&1; echo "sdpa rc $?"
python3 - <<'P'
import json,os,glob
for f in sorted(glob.glob(os.environ["OUT"]+"/*.jsonl")):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f)[:-6], r.get("impl",""), r.get("head_dim"), r["seq"], r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"])
P

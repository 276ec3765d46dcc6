# Kernels v8, call 3: the forward with a loading warpgroup (ws: TMA issued by a third warpgroup that gives
# its registers away, stages released on mbarriers, no CTA barrier per tile) against base and tma.
set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
DISTFLASH_CACHE_DIR=/tmp/dc_ws timeout 120 .dev/ws/cuda_attn check > $OUT/check_ws.log 2>&1; rc=$?; echo "ws check exit $rc"; tail -3 $OUT/check_ws.log
for v in base tma ws; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn bench --fwd-only --seqs 16384,65536 --head-dims 128,64 --json $OUT/fwd_$v.jsonl > $OUT/fwd_$v.log 2>&1; echo "$v bench rc $?"; tail -2 $OUT/fwd_$v.log
done
python3 - <<'P'
import json,os,glob
for f in sorted(glob.glob(os.environ["OUT"]+"/*.jsonl")):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f)[:-6], r.get("head_dim"), r["seq"], r["fwd_tflops"])
P

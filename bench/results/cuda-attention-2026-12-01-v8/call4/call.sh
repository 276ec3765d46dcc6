# Kernels v8, call 4: the backward with a loading warpgroup (wsb: K, V, Q, dO by TMA and LSE, D by
# cp.async from a third warpgroup, stages on mbarriers, one barrier per tile instead of two, dQ
# shares reduced as soon as written) against base (v7) and ws (v8 forward, v7 backward).
set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
DISTFLASH_CACHE_DIR=/tmp/dc_wsb timeout 120 .dev/wsb/cuda_attn check > $OUT/check_wsb.log 2>&1; rc=$?; echo "wsb check exit $rc"; tail -3 $OUT/check_wsb.log
for v in base ws wsb; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 150 .dev/$v/cuda_attn bench --seqs 16384,65536 --head-dims 128,64 --json $OUT/ab_$v.jsonl > $OUT/ab_$v.log 2>&1; echo "$v bench rc $?"; tail -1 $OUT/ab_$v.log | cut -c1-300
done
python3 - <<'P'
import json,os,glob
for f in sorted(glob.glob(os.environ["OUT"]+"/*.jsonl")):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f)[:-6], r.get("head_dim"), r["seq"], r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"])
P

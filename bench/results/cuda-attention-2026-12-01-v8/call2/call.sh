# Kernels v8, call 2: the forward with TMA loads (tma = fwd + K, V, Q through tensor maps) against
# base (v7) and fwd (P·V one tile late, cp.async) in the same call.
set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
DISTFLASH_CACHE_DIR=/tmp/dc_tma timeout 120 .dev/tma/cuda_attn check > $OUT/check_tma.log 2>&1; rc=$?; echo "tma check exit $rc"; tail -3 $OUT/check_tma.log
for v in base fwd tma; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn bench --fwd-only --seqs 16384,65536 --head-dims 128,64 --json $OUT/fwd_$v.jsonl > $OUT/fwd_$v.log 2>&1; echo "$v bench rc $?"; tail -2 $OUT/fwd_$v.log
done
python3 - <<'P'
import json,os,glob
for f in sorted(glob.glob(os.environ["OUT"]+"/*.jsonl")):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f)[:-6], r.get("head_dim"), r["seq"], r["fwd_tflops"])
P

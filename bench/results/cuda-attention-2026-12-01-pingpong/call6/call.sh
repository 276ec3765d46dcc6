set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
DISTFLASH_CACHE_DIR=/tmp/dc_b2 timeout 120 .dev/v_bulk2/cuda_attn check > $OUT/check_v_bulk2.log 2>&1; rc=$?; echo "v_bulk2 check exit $rc"; tail -1 $OUT/check_v_bulk2.log
for v in v_bulk v_bulk2; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn bench --seqs 16384,65536 --head-dims 128 --json $OUT/ab_$v.jsonl > /dev/null 2>&1; echo "$v rc $?"
done
python3 - <<'P'
import json,os,glob
best=None
for f in sorted(glob.glob(os.environ["OUT"]+"/ab_*.jsonl")):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f)[3:-6], r.get("head_dim"), r["seq"], r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"])
P
V=v_bulk2; [ $rc -ne 0 ] && V=v_bulk
echo "session with $V"
mkdir -p $OUT/a
OUT=$OUT/a BIN=.dev/$V/distflash DISTFLASH_CACHE_DIR=/tmp/dc_$V bash bench/peers/attention_session.sh > $OUT/a/session.log 2>&1
grep -E "exit|FAIL|passed" $OUT/a/session.log | head -20; tail -12 $OUT/a/session.log
tar czf $OUT/a.tgz -C $OUT a && rm -rf $OUT/a

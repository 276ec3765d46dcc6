set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 120 .dev/cuda_attn check > $OUT/check.log 2>&1; echo "check exit $?"; tail -3 $OUT/check.log
for v in base new; do b=.dev/cuda_attn; [ $v = base ] && b=.dev/base/cuda_attn
  timeout 120 $b bench --seqs 16384,65536 --head-dims 128,64 --json $OUT/ab_$v.jsonl > /dev/null 2>&1; echo "$v rc $?"
done
python3 - <<'P'
import json,os
for v in ["base","new"]:
    for l in open(os.environ["OUT"]+f"/ab_{v}.jsonl"):
        r=json.loads(l); print(v, r["head_dim"] if "head_dim" in r else "", r["seq"], r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"])
P
mkdir -p $OUT/a
OUT=$OUT/a BIN=.dev/distflash bash bench/peers/attention_session.sh > $OUT/a/session.log 2>&1
grep -E "exit|FAIL|passed|worst" $OUT/a/session.log | head -20; tail -12 $OUT/a/session.log
tar czf $OUT/a.tgz -C $OUT a && rm -rf $OUT/a

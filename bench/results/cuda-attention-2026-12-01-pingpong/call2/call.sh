set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for v in v_pp v_nopp; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn check > $OUT/check_$v.log 2>&1; echo "$v check exit $?"; tail -1 $OUT/check_$v.log
done
for rep in 1 2; do for v in base v_pp v_nopp; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn bench --seqs 16384,65536 --head-dims 128,64 --json $OUT/ab_$v.jsonl > /dev/null 2>&1; echo "$v rc $?"
done; done
python3 - <<'P'
import json,os
for v in ["base","v_pp","v_nopp"]:
    for l in open(os.environ["OUT"]+f"/ab_{v}.jsonl"):
        r=json.loads(l); print(v, r.get("head_dim"), r["seq"], r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"])
P

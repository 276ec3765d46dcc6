set -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for v in v_bulk v_red; do
DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn check > $OUT/check_$v.log 2>&1; echo "$v check exit $?"; tail -1 $OUT/check_$v.log
done
for rep in 1 2; do for v in base v_bulk v_red; do
  DISTFLASH_CACHE_DIR=/tmp/dc_$v timeout 120 .dev/$v/cuda_attn bench --seqs 16384,65536 --head-dims 128,64 --json $OUT/ab_${v}_$rep.jsonl > /dev/null 2>&1; echo "$v rc $?"
done
DISTFLASH_CACHE_DIR=/tmp/dc_v_bulk timeout 120 .dev/v_bulk/cuda_attn bench --seqs 16384,65536 --head-dims 64 --bwd-wgmma false --json $OUT/ab_v_bulk_d64sync_$rep.jsonl > /dev/null 2>&1; echo "d64 sync rc $?"
done
python3 - <<'P'
import json,os,glob
for f in sorted(glob.glob(os.environ["OUT"]+"/ab_*.jsonl")):
    for l in open(f):
        r=json.loads(l); print(os.path.basename(f)[3:-6], r.get("head_dim"), r["seq"], r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"])
P
B=.dev/v_bulk/cuda_attn; export DISTFLASH_CACHE_DIR=/tmp/dc_v_bulk
for k in bwd_block; do
  timeout 200 ncu --kernel-name $k --launch-skip 2 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $OUT/$k $B bench --seqs 8192 --head-dims 128 > /dev/null 2>&1
  ncu --import $OUT/$k.ncu-rep --page source --csv --print-source sass > $OUT/${k}_sass.csv 2>&1
  ncu --import $OUT/$k.ncu-rep --page details > $OUT/${k}_details.txt 2>&1
done
cd $OUT && tar czf prof.tgz *.csv *_details.txt ab_*.jsonl && rm -f *.csv *_details.txt *.ncu-rep ab_*.jsonl

# Kernels v8 (wgmma forward with TMA and a loading warpgroup; backward as v7) in one device call:
# PyTorch float64 checks, the 7B training step with `remat` against transformers (cuDNN SDPA,
# gradient checkpointing) at 16K-128K, and attention against SDPA. Steps start only while the
# call has time left (SECONDS < 530), most important first.
set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
BIN=.dev/v8/distflash
left() { [ $SECONDS -lt 530 ] || { echo "skipped (time): $*"; return 1; }; }
for shape in "128 8 2 1000 bf16" "64 4 4 777 fp16" "128 32 8 4096 bf16"; do
  set -- $shape
  f=/tmp/ours_d$1_h$2_$3_n$4_$5.safetensors
  timeout 60 $BIN attention --device cuda --head-dim $1 --heads $2 --kv-heads $3 --seq-len $4 \
    --dtype $5 --check --json --save $f > /tmp/check.json 2>&1
  echo "d=$1 heads=$2/$3 seq=$4 $5 oracle exit $?: $(grep -o '"passed": [a-z]*' /tmp/check.json)"
  { echo "=== d=$1 heads=$2/$3 seq=$4 $5"; cat /tmp/check.json; } >> $OUT/checks.log
  timeout 60 $PY bench/peers/check_against_torch.py $f >> $OUT/torch_check.log 2>&1; echo "torch check exit $?"
done
B="$BIN bench train --device cuda --preset llama2-7b --json"
run() { left "$2 $3" && { timeout $1 $B --seq-len $2 --checkpoint $3 --warmup $4 --repeats $5 ${6:-} >> $OUT/ours.jsonl 2>> $OUT/session.log || echo "$2 $3 failed: $(tail -n 2 $OUT/session.log)"; }; }
hf() { left "hf $1" && { timeout $2 $PY bench/peers/hf_train_bench.py --seq $1 --layers 32 --checkpointing on --warmup $3 --repeats 1 --out $OUT/hf.jsonl >> $OUT/session.log 2>&1 || echo "hf $1 failed: $(tail -n 3 $OUT/session.log)"; }; }
run 110 131072 remat 0 1
hf 131072 130 0
run 60 16384 remat 1 2
run 80 32768 remat 1 1
run 90 65536 remat 1 1
hf 16384,32768,65536 150 1
$BIN bench report --results $OUT 2>&1 | grep "^|"
left attention && { timeout 40 .dev/v8/cuda_attn bench --seqs 16384,65536 --head-dims 128 --json $OUT/attn.jsonl > /dev/null 2>&1; timeout 60 $PY bench/peers/sdpa_bench.py --seqs 16384,65536 --head-dims 128 --json $OUT/sdpa.jsonl > /dev/null 2>&1; }
python3 - <<'P'
import json, os
out = os.environ["OUT"]
for name in ("ours", "hf", "attn", "sdpa"):
    p = f"{out}/{name}.jsonl"
    if os.path.exists(p):
        for l in open(p):
            r = json.loads(l)
            print(name, {k: r[k] for k in r if k in ("impl", "seq", "checkpoint", "step_secs", "mfu", "peak_memory_gib", "fwd_tflops", "bwd_tflops", "fwdbwd_tflops")})
P
echo "elapsed $SECONDS s"

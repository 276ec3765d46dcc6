set -u
# H200 call 2: 19545a7 (the MLP over whole rows where memory is left) against 3c0d928 at 16K,
# all 32 layers, in rounds; then transformers and + Liger at 128K.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
mkdir -p $OUT/ab
ab() { timeout 100 $2 bench train --device cuda --preset llama2-7b --json --optimizer --seq-len $3 2>>$OUT/ab/ab.err | sed "s/^{/{\"build\":\"$1\",/" >> $OUT/ab/ab.jsonl; }
for i in 1 2; do ab new .dev/distflash 16384; ab prev .dev/prev/distflash 16384; done
python3 -c "
import json
for l in open('$OUT/ab/ab.jsonl'):
    d=json.loads(l); print(d['build'], d['seq'], d.get('whole_layers'), d.get('whole_mlp'), d.get('offload'), round(d['step_secs'],4), d.get('peak_memory_gib'), d.get('estimated_memory_gib'))"
grep -i "error\|note" $OUT/ab/ab.err | sort | uniq -c | head -5
echo "A/B done at $SECONDS s"
O=$OUT/table128; mkdir -p $O
OUT=$O SEQS=131072 STEPS=3 STACKS=hf HF_TIMEOUT=240 bash bench/peers/adamw_step_session.sh
echo "hf 128K done at $SECONDS s"
OUT=$O SEQS=131072 STEPS=3 STACKS=liger HF_TIMEOUT=$((585 - SECONDS)) bash bench/peers/adamw_step_session.sh
grep -h '"status"' $O/hf.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['impl'], d['seq'], d.get('status'), round(d.get('step_secs') or 0,3), round(d.get('peak_memory_gib') or 0,1))"
echo "done at $SECONDS s"

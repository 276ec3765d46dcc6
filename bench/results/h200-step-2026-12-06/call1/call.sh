set -u
# H200 call 1: distflash at 16K-128K (all 32 layers, AdamW, exact update, defaults), then
# transformers and transformers + Liger at 16K-64K.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
O=$OUT/table; mkdir -p $O
OUT=$O SEQS="16384 32768 65536" STEPS=3 STACKS=ours RUN_TIMEOUT=120 bash bench/peers/adamw_step_session.sh
echo "ours 16K-64K done at $SECONDS s"
OUT=$O SEQS=131072 STEPS=2 STACKS=ours RUN_TIMEOUT=170 bash bench/peers/adamw_step_session.sh
echo "ours 128K done at $SECONDS s"
python3 -c "
import json
for l in open('$O/ours.jsonl'):
    d=json.loads(l)
    if 'step' in d: print(d['seq'], d['step'], round(d['step_secs'],3))
    else: print(d['seq'], {k:v for k,v in d.items() if k in ('offload','whole_layers','peak_memory_gib','estimated_memory_gib','wall_secs')})" 2>&1 | head -30
left=$((585 - SECONDS))
OUT=$O SEQS="16384 32768 65536" STEPS=3 STACKS="hf liger" HF_TIMEOUT=$((left / 2)) bash bench/peers/adamw_step_session.sh
grep -h '"step_secs"' $O/hf.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); print(d['impl'], d['seq'], d.get('status'), round(d.get('step_secs') or 0,3), round(d.get('peak_memory_gib') or 0,1))"
echo "done at $SECONDS s"

set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
OUT=$OUT SEQS="16384 32768 65536 131072" STEPS=3 STACKS="ours liger hf" RUN_TIMEOUT=150 HF_TIMEOUT=${HF_TIMEOUT:-200} bash bench/peers/adamw_step_session.sh
python3 -c "
import json
for l in open('$OUT/ours.jsonl'):
    d=json.loads(l)
    if 'step' in d: print('ours', d['seq'], d['step'], round(d['step_secs'],3), d.get('offload_asked'))
for l in open('$OUT/hf.jsonl'):
    d=json.loads(l); print(d['impl'], d['seq'], d.get('status'), d.get('step_secs'), d.get('peak_memory_gib'))
"
grep -E '^(===|exit)|whole|GPU 0|failed|Error' $OUT/session.log | cut -c1-260

set -u
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bash .dev/wholeoffload.sh > $OUT/wholeoffload.log 2>&1; tail -4 $OUT/wholeoffload.log
OUT=$OUT SEQS="${SEQS:-16384 32768 65536}" STEPS=3 STACKS="ours hf liger" RUN_TIMEOUT=120 HF_TIMEOUT=${HF_TIMEOUT:-150} bash bench/peers/adamw_step_session.sh
python3 -c "
import json
for l in open('$OUT/ours.jsonl'):
    d=json.loads(l); print('ours', d['seq'], d['step'], round(d['step_secs'],3), d.get('offload_asked'), d.get('peak_memory_gib'))"
grep -E '^(===|exit)|whole|GPU 0' $OUT/session.log | cut -c1-200
cut -c1-300 $OUT/hf.jsonl

set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
LAYERS=$([ "$total" -gt 120000 ] && echo 32 || echo 16)
mkdir -p $OUT/resume; OUT=$OUT/resume PARTS=resume bash bench/peers/exact_update.sh > $OUT/resume/out.txt 2>&1; tail -2 $OUT/resume/out.txt; cut -c1-300 $OUT/resume/resume.jsonl 2>/dev/null
if [ "$LAYERS" = 32 ]; then
  OUT=$OUT SEQS="16384 32768 65536" STEPS=3 STACKS="ours hf liger" RUN_TIMEOUT=120 HF_TIMEOUT=150 bash bench/peers/adamw_step_session.sh
fi
python3 -c "
import json
import os
for l in (open('$OUT/ours.jsonl') if os.path.exists('$OUT/ours.jsonl') else []):
    d=json.loads(l)
    if 'step' in d: print('ours', d['seq'], d['step'], round(d['step_secs'],3), d.get('offload_asked'))
try:
  for l in open('$OUT/hf.jsonl'):
    d=json.loads(l); print(d['impl'], d['seq'], d.get('status'), d.get('step_secs'), d.get('peak_memory_gib'))
except FileNotFoundError: pass
"
grep -E '^(===|exit)|GPU 0' $OUT/session.log 2>/dev/null | cut -c1-220
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
for i in 1 2; do for n in 16384 32768 65536; do for o in activations none; do
  timeout 120 .dev/distflash bench train --device cuda --preset llama2-7b --layers $LAYERS --checkpoint remat --json --optimizer --seq-len $n --offload $o 2>>$OUT/offload_ab.err | sed "s/^{/{\"offload_asked\":\"$o\",/" >> $OUT/offload_ab.jsonl
done; done; done
python3 -c "
import json
for l in open('$OUT/offload_ab.jsonl'):
    d=json.loads(l); print('offload', d['offload_asked'], d['seq'], d.get('whole_layers'), round(d['step_secs'],4), d.get('peak_memory_gib'), d.get('estimated_memory_gib'))"
grep -h "GPU 0\|error" $OUT/offload_ab.err | cut -c1-200 | sort | uniq -c

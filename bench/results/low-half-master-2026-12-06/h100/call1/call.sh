set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
LAYERS=$([ "$total" -gt 120000 ] && echo 32 || echo 16)
mkdir -p $OUT/checks
(time OUT=$OUT/checks bash bench/peers/gpu_train_checks.sh) > $OUT/checks.log 2>&1; tail -4 $OUT/checks.log
grep -h "FAIL\|low-half\|low half\|resumed\|exact update\|1000 steps\|master" $OUT/checks/gpu_tests.log | cut -c1-150 | head -20
bash .dev/wholeoffload.sh > $OUT/wholeoffload.log 2>&1; tail -16 $OUT/wholeoffload.log
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
ab() { local tag=$1 b=$2 n=$3; shift 3
  timeout 150 $b bench train --device cuda --preset llama2-7b --layers $LAYERS --checkpoint remat --json --optimizer --seq-len $n "$@" 2>>$OUT/ab.err | sed "s/^{/{\"build\":\"$tag\",/" >> $OUT/ab.jsonl; }
for n in 16384 32768; do for i in 1 2; do
  ab new .dev/distflash $n; ab main .dev/main/distflash $n
done; done
python3 -c "
import json
for l in open('$OUT/ab.jsonl'):
    d=json.loads(l); print(d['build'], d['seq'], d.get('whole_layers'), round(d['step_secs'],4), round(d.get('ideal_step_secs') or 0,4), d.get('peak_memory_gib'), d.get('estimated_memory_gib'))"
grep -h "GPU 0" $OUT/ab.err | sort | uniq -c | cut -c1-250; grep -i "error" $OUT/ab.err | head -3

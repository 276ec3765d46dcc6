set -u
mkdir -p $OUT/checks
(time OUT=$OUT/checks bash bench/peers/gpu_train_checks.sh) > $OUT/checks.log 2>&1; tail -4 $OUT/checks.log
grep -h "whole layers" $OUT/checks/parity.log | tail -8
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
ab() { local tag=$1 b=$2 n=$3; shift 3
  timeout 150 $b bench train --device cuda --preset llama2-7b --layers 16 --checkpoint remat --json --optimizer --seq-len $n "$@" 2>>$OUT/ab.err | sed "s/^{/{\"build\":\"$tag\",/" >> $OUT/ab.jsonl; }
for n in 16384 32768; do for i in 1 2; do
  ab new .dev/distflash $n; ab prev .dev/prev/distflash $n; ab new0 .dev/distflash $n --whole-layers 0
done; done
python3 -c "
import json
for l in open('$OUT/ab.jsonl'):
    d=json.loads(l); print(d['build'], d['seq'], d.get('whole_layers'), round(d['step_secs'],4), round(d.get('ideal_step_secs') or 0,4), d.get('peak_memory_gib'), d.get('estimated_memory_gib'))"
grep -h "GPU 0" $OUT/ab.err | sort | uniq -c | head; grep -i "error" $OUT/ab.err | head -3
.dev/distflash bench train --device cuda --preset llama2-7b --layers 16 --checkpoint remat --whole-layers 0 --seq-len 16384 --warmup 1 --repeats 1 --profile > $OUT/profile16k.log 2>&1; tail -22 $OUT/profile16k.log
nvidia-smi --query-gpu=name --format=csv,noheader

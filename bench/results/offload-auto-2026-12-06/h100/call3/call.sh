set -u
# H100: the GPU checks of this build (the first dW products written over scratch), then the
# step before (bfca3db, .dev/prev) and after, each twice alternating, then the GEMMs alone.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p $OUT/checks
(time OUT=$OUT/checks bash bench/peers/gpu_train_checks.sh) > $OUT/checks.log 2>&1; tail -4 $OUT/checks.log
echo "PASS lines: $(grep -c PASS $OUT/checks/gpu_tests.log)"; grep -h "FAIL\|test result" $OUT/checks/gpu_tests.log | head -8
grep -h "dW =" $OUT/checks/gpu_tests.log | cut -c1-150 | head -3
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
ab() { local tag=$1 b=$2 n=$3
  timeout 150 $b bench train --device cuda --preset llama2-7b --layers 16 --json --optimizer --seq-len $n 2>>$OUT/ab.err | sed "s/^{/{\"build\":\"$tag\",/" >> $OUT/ab.jsonl; }
for n in 16384 32768; do for i in 1 2; do
  ab prev .dev/prev/distflash $n; ab new .dev/distflash $n
done; done
python3 -c "
import json
for l in open('$OUT/ab.jsonl'):
    d=json.loads(l); print(d['build'], d['seq'], d.get('whole_layers'), d.get('offload'), round(d['step_secs'],4), d.get('all_secs'), d.get('peak_memory_gib'), d.get('estimated_memory_gib'))"
grep -i "error" $OUT/ab.err | head -3
.dev/gpu_timing ops --rows 16384 2>&1 | grep "^bf16" | tee $OUT/gemms.log

set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
mkdir -p $OUT/checks
(time OUT=$OUT/checks bash bench/peers/gpu_train_checks.sh) > $OUT/checks.log 2>&1; tail -4 $OUT/checks.log
echo "PASS lines: $(grep -c PASS $OUT/checks/gpu_tests.log)"; grep -h "FAIL" $OUT/checks/gpu_tests.log | head -5
# --offload auto (the default) against explicit none and activations, train as a user runs it.
cat > /tmp/l16.json <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": 16, "num_attention_heads": 32,
 "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "max_position_embeddings": 4096, "tie_word_embeddings": false, "hidden_act": "silu"}
JSON
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
for n in 16384 32768; do for off in auto none activations; do
  echo "=== seq $n --offload $off" >> $OUT/auto.err
  timeout 120 .dev/distflash train --device cuda --config /tmp/l16.json --seq-len $n --batch 1 --steps 4 --lr 1e-5 --warmup 1 --offload $off --json 2>>$OUT/auto.err | sed "s/^{/{\"asked\":\"$off\",\"seq\":$n,/" >> $OUT/auto.jsonl
done; done 2>/dev/null
grep -h "===\|note:\|GPU 0\|rror" $OUT/auto.err | cut -c1-260
python3 - $OUT/auto.jsonl <<'PY'
import json,sys,statistics as st
runs={}
for l in open(sys.argv[1]):
    d=json.loads(l); k=(d['asked'],d['seq'])
    if 'step_secs' in d and d.get('step',1)>1: runs.setdefault(k,{}).setdefault('steps',[]).append(d['step_secs'])
    if 'wall_secs' in d: runs.setdefault(k,{})['summary']=(d.get('offload'),d.get('whole_layers'))
for k,v in runs.items(): print(k, v.get('summary'), 'median', round(st.median(v.get('steps',[0])),4), v.get('steps'))
PY

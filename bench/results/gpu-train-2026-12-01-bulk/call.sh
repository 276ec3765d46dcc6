set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
B=".dev/v_bulk/distflash bench train --device cuda --preset llama2-7b --json"
run() { timeout $1 $B --seq-len $2 --checkpoint $3 --warmup $4 --repeats $5 ${6:-} >> $OUT/ours.jsonl 2>> $OUT/session.log || echo "$2 $3 failed: $(tail -n 2 $OUT/session.log)"; }
run 90 32768 remat 1 2
run 90 65536 remat 1 1
run 60 16384 remat 1 2
run 70 32768 layer 1 1
timeout 150 python3 bench/peers/hf_train_bench.py --seq 16384,32768,65536 --layers 32 --checkpointing on --warmup 1 --repeats 1 --out $OUT/hf.jsonl >> $OUT/session.log 2>&1 || echo "hf failed: $(tail -n 3 $OUT/session.log)"
run 110 131072 remat 0 1 --ignore-memory-estimate
.dev/v_bulk/distflash bench report --results $OUT 2>&1 | grep "^|"
run 110 131072 layer 0 1 --ignore-memory-estimate
python3 -c "
import json
for l in open('$OUT/ours.jsonl'):
    r=json.loads(l); print(r['seq'], r['checkpoint'], round(r['step_secs'],3), round(r['mfu'],3), round(r['peak_memory_gib'],1), round(r['estimated_memory_gib'],1))
"

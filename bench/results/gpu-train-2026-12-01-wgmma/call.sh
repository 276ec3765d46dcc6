set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
B=".dev/distflash bench train --device cuda --preset llama2-7b --json"
for ck in remat layer; do timeout 150 $B --seq-len 65536 --checkpoint $ck --warmup 1 --repeats 2 >> $OUT/ours.jsonl 2>> $OUT/session.log || echo "64K $ck failed"; done
for ck in layer remat; do timeout 150 $B --seq-len 131072 --checkpoint $ck --warmup 0 --repeats 1 --ignore-memory-estimate >> $OUT/ours.jsonl 2>> $OUT/session.log || echo "128K $ck failed: $(tail -n 2 $OUT/session.log)"; done
cat $OUT/ours.jsonl | cut -c1-300
timeout 260 python3 bench/peers/hf_train_bench.py --seq 65536,131072 --layers 32 --checkpointing on --warmup 1 --repeats 1 --out $OUT/hf.jsonl >> $OUT/session.log 2>&1 || echo "hf failed: $(tail -n 3 $OUT/session.log)"
.dev/distflash bench report --results $OUT 2>&1 | grep "^|"

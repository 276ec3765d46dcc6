#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash of call 2. Issue 17: llama2-7b with
# AdamW, all 32 layers, batch 1, one training step each, beside transformers in one run:
# 1. distflash 256K, --checkpoint layer --offload activations (estimated 121.4 GiB, 64 GiB pinned);
# 2. distflash 128K, --checkpoint layer, no offload (estimated 135.4 GiB);
# 3. transformers 128K (gradient checkpointing, SDPA, fused AdamW; hf_train_bench.py).
# GPU memory by nvidia-smi every 0.5 s (the device's used memory: the pool's peak plus the CUDA
# context and cuBLAS workspace).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
T="train --device cuda --preset llama2-7b --batch 1 --steps 1 --lr 1e-5 --json"
watch_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > $OUT/mem_$1.log & }
peak() { sort -n $OUT/mem_$1.log | tail -n 1; }
watch_mem 256k; began=$(date +%s)
timeout 270 .dev/distflash $T --seq-len 262144 --checkpoint layer --offload activations > $OUT/train_256k.json 2> $OUT/train_256k.err
echo "distflash 256K layer offload activations: exit $? $(( $(date +%s) - began )) s, peak used $(peak 256k) MiB"; kill %1
grep -h "estimate\|step 1\|s/step\|GiB" $OUT/train_256k.err | tail -n 4
watch_mem 128k; began=$(date +%s)
timeout 130 .dev/distflash $T --seq-len 131072 --checkpoint layer > $OUT/train_128k.json 2> $OUT/train_128k.err
echo "distflash 128K layer: exit $? $(( $(date +%s) - began )) s, peak used $(peak 128k) MiB"; kill %1
grep -h "estimate\|step 1\|s/step\|GiB" $OUT/train_128k.err | tail -n 4
timeout 170 python3 bench/peers/hf_train_bench.py --seq 131072 --optimizer adamw --warmup 1 --repeats 1 --out $OUT/hf_128k.jsonl > $OUT/hf_128k.log 2>&1
echo "transformers 128K adamw: exit $?"; tail -n 1 $OUT/hf_128k.jsonl | grep -o '"status":"[a-z]*"\|"step_secs":[0-9.]*\|"peak_memory_gib":[0-9.]*' | paste -sd' '

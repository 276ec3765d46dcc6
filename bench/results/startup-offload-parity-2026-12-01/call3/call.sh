# binaries of e25c512 (after the offload and qwen merges)
# Device call 3: offload (issue 17) after the merge of the offload branch
W=$OUT; export DISTFLASH_CACHE_DIR=/tmp/dc; B=.dev/distflash; L=$W/offload.log
(DISTFLASH_GPU_TESTS=1 timeout 200 .dev/gpu_ops --test-threads 1 --nocapture > $W/gpu_ops.log 2>&1; echo "gpu_ops exit $?" >> $L)
for o in none activations; do
  timeout 150 $B bench train --device cuda --preset llama2-7b --seq-len 65536 --checkpoint remat --repeats 2 --offload $o --json >> $L 2>&1
done
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > $W/mem128k.log &
timeout 200 $B train --device cuda --preset llama2-7b --seq-len 131072 --batch 1 --steps 1 --lr 1e-5 --offload activations --json >> $L 2>&1
kill %1

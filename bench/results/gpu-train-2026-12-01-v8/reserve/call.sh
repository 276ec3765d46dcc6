# The run's tensors taken from the driver up front (CudaBackend::reserve_memory, called by
# GpuRun::open with the estimate less its 1.5 GiB allowance): does the pool serve the step from
# that block? At 64K remat the block (84.4 GiB) and a second copy of the step's tensors (85.9)
# would not both fit in 139 GiB, so the step only runs if the pool reuses the block. nvidia-smi
# samples the GPU's used memory meanwhile.
set -u
export DISTFLASH_CACHE_DIR=/tmp/dc
nvidia-smi --query-gpu=memory.used,memory.total --format=csv -lms 250 > $OUT/mem.csv 2>&1 &
SMI=$!
B=".dev/v8r/distflash bench train --device cuda --preset llama2-7b --json"
timeout 80 $B --seq-len 65536 --checkpoint remat --warmup 0 --repeats 1 >> $OUT/ours.jsonl 2>> $OUT/session.log; echo "64K rc $?"
timeout 50 $B --seq-len 16384 --checkpoint remat --warmup 1 --repeats 2 >> $OUT/ours.jsonl 2>> $OUT/session.log; echo "16K rc $?"
kill $SMI
tail -4 $OUT/session.log
python3 -c "
import json
for l in open('$OUT/ours.jsonl'):
    r=json.loads(l); print(r['seq'], r['checkpoint'], round(r['step_secs'],3), round(r['peak_memory_gib'],1), round(r['estimated_memory_gib'],1))
"
sort -t, -k1 -n $OUT/mem.csv | tail -2

set -u; export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
short() { grep -o '"seq":[0-9]*\|"head_dim":[0-9]*\|"f[a-z]*_tflops":[0-9.a-z]*\|"bwd_tflops":[0-9.a-z]*' | paste -sd' ' | sed 's/"seq"/\n"seq"/g'; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
echo "=== check cur"; timeout 100 ./cuda_attn check 2>&1 | tail -n 6 | tee $OUT/check.log
echo "=== check cur bwd4"; timeout 100 ./cuda_attn --bwd-warps 4 check 2>&1 | tail -n 1
for dt in bf16 fp16; do timeout 60 ./cuda_attn dump --out /tmp/o_$dt.safetensors --dtype $dt --seq 1000 --heads 8 --kv-heads 2 >/dev/null && timeout 100 python3 peers/check_against_torch.py /tmp/o_$dt.safetensors | tee -a $OUT/torch_check.log; done
echo "=== bench cur"; timeout 200 ./cuda_attn bench --json $OUT/cur.jsonl | short
echo "=== bench v3"; timeout 100 ./cuda_attn_v3 bench --seqs 16384,65536 --head-dims 128 | short
echo "=== sdpa"; timeout 200 python3 peers/sdpa_bench.py --json $OUT/sdpa.jsonl | grep -o '"impl": "[a-z_0-9]*"\|"seq": [0-9]*\|"head_dim": [0-9]*\|"f[a-z]*_tflops": [0-9.]*\|"bwd_tflops": [0-9.]*' | paste -sd' ' | sed 's/"impl"/\n"impl"/g'

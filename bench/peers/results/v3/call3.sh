set -u; export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
short() { grep -o '"seq":[0-9]*\|"head_dim":[0-9]*\|"f[a-z]*_tflops":[0-9.a-z]*\|"bwd_tflops":[0-9.a-z]*' | paste -sd' ' | sed 's/"seq"/\n"seq"/g'; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
echo "=== check cur"; timeout 100 ./cuda_attn check 2>&1 | tail -n 6
echo "=== bench cur"; timeout 200 ./cuda_attn bench --json $OUT/cur.jsonl | short
for b in v2 abl_store abl_nodq; do echo "=== bench $b"; timeout 100 ./cuda_attn_$b bench --seqs 16384,65536 --head-dims 128 | short; done
echo "=== fwd kv32"; timeout 100 ./cuda_attn_abl_kv32 bench --fwd-only --seqs 16384,65536 --head-dims 128,64 | short
echo "=== sdpa"; timeout 200 python3 peers/sdpa_bench.py --json $OUT/sdpa.jsonl | grep -o '"impl": "[a-z_0-9]*"\|"seq": [0-9]*\|"head_dim": [0-9]*\|"f[a-z]*_tflops": [0-9.]*\|"bwd_tflops": [0-9.]*' | paste -sd' ' | sed 's/"impl"/\n"impl"/g'

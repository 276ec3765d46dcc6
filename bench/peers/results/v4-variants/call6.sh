set -u; export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
short() { grep -o '"seq":[0-9]*\|"head_dim":[0-9]*\|"f[a-z]*_tflops":[0-9.a-z]*\|"bwd_tflops":[0-9.a-z]*' | paste -sd' ' | sed 's/"seq"/\n"seq"/g'; }
echo "=== check B"; timeout 100 ./cuda_attn --fwd-warps 4 --fwd-mtiles 2 --fwd-qreg true --bwd-warps 4 check 2>&1 | tail -n 1
echo "=== A d64 default"; timeout 100 ./cuda_attn bench --seqs 16384,65536 --head-dims 64 | tee $OUT/a.jsonl | short
echo "=== B d64 fwd4x2r bwd4"; timeout 100 ./cuda_attn --fwd-warps 4 --fwd-mtiles 2 --fwd-qreg true --bwd-warps 4 bench --seqs 16384,65536 --head-dims 64 | tee $OUT/b.jsonl | short
echo "=== C d128 bwd4"; timeout 100 ./cuda_attn --bwd-warps 4 bench --seqs 16384,65536 --head-dims 128 | tee $OUT/c.jsonl | short
echo "=== sdpa d64"; timeout 100 python3 peers/sdpa_bench.py --seqs 16384,65536 --head-dims 64 | grep -o '"impl": "[a-z_0-9]*"\|"seq": [0-9]*\|"f[a-z]*_tflops": [0-9.]*\|"bwd_tflops": [0-9.]*' | paste -sd' ' | sed 's/"impl"/\n"impl"/g'

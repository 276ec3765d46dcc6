set -u; export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1; B=./cuda_attn
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
for v in "" "--fwd-warps 12 --fwd-qreg false" "--fwd-warps 4 --fwd-mtiles 2 --fwd-qreg false" "--fwd-warps 8 --fwd-mtiles 2 --fwd-qreg true"; do
  echo "=== check $v"; timeout 100 $B $v check 2>&1 | tail -n 1
done
echo "=== default full"; timeout 200 $B bench --json $OUT/default.jsonl | cut -c1-400
for v in "--fwd-warps 12 --fwd-qreg false" "--fwd-warps 4 --fwd-mtiles 2 --fwd-qreg false" "--fwd-warps 8 --fwd-mtiles 2 --fwd-qreg false"; do
  echo "=== fwd $v"; timeout 100 $B $v bench --fwd-only --seqs 16384,65536 --head-dims 128 | grep -o '"seq":[0-9]*\|"fwd_tflops":[0-9.]*' | paste -sd' '
done
for v in "--fwd-warps 8 --fwd-mtiles 2 --fwd-qreg true" "--fwd-warps 4 --fwd-mtiles 2 --fwd-qreg false"; do
  echo "=== fwd d64 $v"; timeout 100 $B $v bench --fwd-only --seqs 16384,65536 --head-dims 64 | grep -o '"seq":[0-9]*\|"fwd_tflops":[0-9.]*' | paste -sd' '
done
echo "=== sdpa"; timeout 200 python3 peers/sdpa_bench.py --json $OUT/sdpa.jsonl | grep -o '"impl": "[a-z_0-9]*"\|"seq": [0-9]*\|"head_dim": [0-9]*\|"f[a-z]*_tflops": [0-9.]*\|"bwd_tflops": [0-9.]*' | paste -sd' ' | sed 's/"impl"/\n"impl"/g'

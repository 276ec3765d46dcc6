set -u; export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
echo "=== example check"; timeout 100 ./cuda_attn check 2>&1 | tail -n 1
for shape in "128 8 2 1000 bf16" "64 4 4 777 fp16"; do set -- $shape; f=/tmp/o_$1_$5.safetensors
  timeout 200 ./distflash attention --device cuda --head-dim $1 --heads $2 --kv-heads $3 --seq-len $4 --dtype $5 --check --json --save $f > $OUT/cli_$1_$5.json 2>&1
  echo "cli d$1 $5 exit $?: $(grep -o '"passed": [a-z]*' $OUT/cli_$1_$5.json)"; timeout 100 python3 peers/check_against_torch.py $f | grep -o '"pass": [a-z]*'; done
timeout 200 ./distflash attention --device cuda --workers 4 --schedule balanced --seq-len 3000 --heads 8 --kv-heads 2 --head-dim 128 --check --json > $OUT/virtual.json 2>&1; echo "virtual exit $?: $(grep -o '"passed": [a-z]*' $OUT/virtual.json)"

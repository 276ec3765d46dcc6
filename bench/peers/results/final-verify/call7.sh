set -u; export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
echo "=== check"; timeout 100 ./cuda_attn check 2>&1 | tail -n 6 | tee $OUT/check.log
for dt in bf16 fp16; do timeout 60 ./cuda_attn dump --out /tmp/o_$dt.safetensors --dtype $dt --seq 1000 --heads 8 --kv-heads 2 >/dev/null && timeout 100 python3 peers/check_against_torch.py /tmp/o_$dt.safetensors | tee -a $OUT/torch_check.log | grep -o '"pass": [a-z]*'; done
echo "=== bench"; timeout 100 ./cuda_attn bench --seqs 16384 --head-dims 128,64 --json $OUT/bench.jsonl

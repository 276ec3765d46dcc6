set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
timeout 200 .dev/cuda_attn check > $OUT/check_wgmma.log 2>&1; echo "check exit $?"; tail -25 $OUT/check_wgmma.log
timeout 100 .dev/cuda_attn --bwd-wgmma false bench --seqs 16384 --head-dims 128 --json $OUT/v4.jsonl 2>&1 | tail -3
timeout 100 .dev/cuda_attn bench --seqs 4096,16384,65536 --head-dims 128 --json $OUT/wgmma.jsonl 2>&1 | tail -5

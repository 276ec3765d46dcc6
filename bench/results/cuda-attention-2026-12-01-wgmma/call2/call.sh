set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
timeout 200 .dev/cuda_attn check > $OUT/check_wgmma.log 2>&1; rc=$?; echo "check exit $rc"; tail -4 $OUT/check_wgmma.log
timeout 100 .dev/cuda_attn --fwd-wgmma false bench --seqs 16384 --head-dims 128 --json $OUT/v5.jsonl 2>&1 | tail -1
timeout 100 .dev/cuda_attn bench --seqs 4096,16384,65536 --head-dims 128 --json $OUT/v6.jsonl 2>&1 | tail -3
if [ $rc = 0 ]; then BIN=.dev/distflash bash bench/peers/attention_session.sh > $OUT/session.log 2>&1; tail -30 $OUT/session.log; fi

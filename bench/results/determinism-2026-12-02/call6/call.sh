#!/usr/bin/env bash
# Device call 6 (nvidia-h200), carry [".dev"]: call 5's .dev/ (the final kernels). Issue 18's
# GQA 32/8 table after the reorder: `bench attention --kv-heads 8` then SDPA (FA2, cuDNN,
# enable_gqa), causal bf16, batch 1, 32 heads, d128, 4K-256K, as results/pairs-2026-12-02/call2.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R/gqa
SEQS=4096,8192,16384,32768,65536,131072,262144
timeout 110 .dev/distflash bench attention --device cuda --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/ours.jsonl > $R/gqa/ours.log 2>&1; echo "gqa ours: exit $?"
timeout 170 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/sdpa.jsonl > $R/gqa/sdpa.log 2>&1; echo "gqa sdpa: exit $?"
.dev/distflash bench report --results $R/gqa > $R/gqa/RESULTS.md 2>&1; grep "^| [0-9]" $R/gqa/RESULTS.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

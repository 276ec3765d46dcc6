#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]. Build: v34 = .dev/ (call 2's).
# Issue 18's d128 tables on v34, MHA and GQA 32/8, 4K-256K, beside SDPA's FlashAttention-2 and
# cuDNN backends in the same call (as bench/results/short-bwd-2026-12-04 call 3 made them on
# v31).
# Prediction, written before the call: the forward +1% at 8K against that call's (652 MHA, 656
# GQA), within 1% elsewhere; the backward and SDPA within run-to-run spread (~2% at 8K).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
pack() { tar czf $OUT/runs.tgz -C $OUT runs; }
D=.dev/distflash
SEQS=4096,8192,16384,32768,65536,131072,262144
mkdir -p $R/mha $R/gqa
timeout 80 $D bench attention --device cuda --seqs $SEQS --head-dims 128 --json $R/mha/ours.jsonl > $R/mha/ours.log 2>&1; echo "mha ours: exit $?"
timeout 100 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --json $R/mha/sdpa.jsonl > $R/mha/sdpa.log 2>&1; echo "mha sdpa: exit $?"
$D bench report --results $R/mha --out $R/mha/RESULTS.md; grep "^| [0-9]" $R/mha/RESULTS.md; pack
timeout 80 $D bench attention --device cuda --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/ours.jsonl > $R/gqa/ours.log 2>&1; echo "gqa ours: exit $?"
timeout 100 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/sdpa.jsonl > $R/gqa/sdpa.log 2>&1; echo "gqa sdpa: exit $?"
$D bench report --results $R/gqa --out $R/gqa/RESULTS.md; grep "^| [0-9]" $R/gqa/RESULTS.md; pack
rm -rf $R

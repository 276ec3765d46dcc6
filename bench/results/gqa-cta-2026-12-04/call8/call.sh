#!/usr/bin/env bash
# Device call 8 (nvidia-h200), carry [".dev"]. Build: main with the review's timer refactor (one
# warm_up helper times the first run and loads for WARM_MS, in timing.rs and sdpa_bench.py alike;
# the same runs as before).
# Checks both timers still run and load: attention_tables.sh on one short shape.
# Prediction: exit 0, one table row, within a few % of call 6's 4K row (MHA 535 / 486; cuDNN 404
# forward+backward).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
TIMEOUT=120 bash bench/peers/attention_tables.sh $R/mha 4096 128; echo "attention_tables.sh: exit $?"
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

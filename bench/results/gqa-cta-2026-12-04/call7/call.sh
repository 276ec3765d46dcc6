#!/usr/bin/env bash
# Device call 7 (nvidia-h200), carry [".dev"]. Build: call 6's (the scripts are new, the
# binaries unchanged but for comments).
# Checks bench/peers/attention_tables.sh (new: `bench attention`, sdpa_bench.py and the table in
# one script, which headdim_bench.sh and attention_session.sh now call for their timing) on a
# small shape, and headdim_bench.sh through it at one head dim and length.
# Prediction: both exit 0 with a table of one row each.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
TIMEOUT=120 bash bench/peers/attention_tables.sh $R/gqa 4096 128 --kv-heads 8; echo "attention_tables.sh: exit $?"
mkdir -p $R/hd
OUT=$R/hd HEADDIM_DIMS=64 HEADDIM_SEQS=4096 bash bench/peers/headdim_bench.sh > $R/hd/console.log 2>&1; echo "headdim_bench.sh: exit $?"
grep "^=== check\|^exit\|^| [0-9]\|: exit" $R/hd/console.log
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

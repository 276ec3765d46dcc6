#!/usr/bin/env bash
# Device call 2 (nvidia-h200): issue 20's fine-tuning check (bench/peers/finetune_check.py).
set -u
git rev-parse --short HEAD > $OUT/commit 2>/dev/null
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache PYTHONUNBUFFERED=1
$PY bench/peers/finetune_check.py --bin .dev/distflash --out $OUT/finetune 2>&1 | tee $OUT/finetune.log
cd $OUT && tar czf finetune.tgz finetune && rm -rf finetune

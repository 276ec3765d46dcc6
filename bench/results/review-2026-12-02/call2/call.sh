#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: call1's binding_profile.py again, with the wheel
# installed by binding_env.sh (call1's script had forgotten it: ModuleNotFoundError).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
source bench/peers/binding_env.sh > /dev/null 2>&1
timeout 60 python3 bench/peers/binding_profile.py --seqs 4096 --out $OUT/binding_profile.json > $OUT/binding_profile.log 2>&1; echo "binding_profile: exit $?"
python3 -c "import json; [print(r['impl'], round(r['event_ms'], 3), round(r['kernel_ms'], 3)) for r in json.load(open('$OUT/binding_profile.json'))]"

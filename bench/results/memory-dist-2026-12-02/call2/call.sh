#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash-*.whl of e8e4812 (dist_flash_attn
# with masks). bench/peers/dist_binding.sh: virtual ranks causal and masked, the one-process
# NCCL group, the refusals; the JSON copied small enough to come back.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
timeout 300 bash bench/peers/dist_binding.sh > $OUT/dist_binding.log 2>&1; echo "dist_binding: exit $?"
grep '"mask"' $OUT/dist_binding.log | python3 -c "
import json, sys
for l in sys.stdin:
    r = json.loads(l)
    print(r['world'], r['schedule'], r['mask'], {k: round(r[k]['ratio'], 2) for k in ('out', 'dq', 'dk', 'dv')}, r['passed'])
"
tail -n 1 $OUT/dist_binding.log

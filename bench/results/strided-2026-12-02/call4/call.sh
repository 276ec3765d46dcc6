#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash of call 2 and the wheel of main with
# dist_flash_attn's return_lse.
# 1. dist_binding.py: dist_flash_attn (virtual ranks, the one-process NCCL group, errors) and
#    the new LSE check.
# 2. The binding's speed again (torch_binding.py's speed part alone) at 4K and 16K, d128, after
#    `bench attention` at the same shapes: call 1 had 16K d128 at 1.042x.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
source bench/peers/binding_env.sh
(cd bench/peers && timeout 200 python3 dist_binding.py --out $OUT/dist_binding.json > $OUT/dist_binding.log 2>&1); echo "dist_binding: exit $?"
grep -h '"lse_abs_err"' $OUT/dist_binding.log | cut -c1-160; tail -n 1 $OUT/dist_binding.log
timeout 40 .dev/distflash bench attention --device cuda --seqs 4096,16384 --head-dims 128 --json $OUT/distflash.jsonl > /dev/null 2>&1; echo "bench attention: exit $?"
(cd bench/peers && timeout 90 python3 -c "
import json, sys, torch_binding as t
rows, ok = t.speed(sys.argv[1], 32)
print('speed passed', ok)" $OUT/distflash.jsonl > $OUT/speed.log 2>&1); echo "speed: exit $?"
python3 - $OUT/speed.log <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); print(r["seq"], r["head_dim"], "bshd/binary %.3f head-major/binary %.3f" % (r["bshd_over_binary"], r["head_major_over_binary"]))
    else:
        print(l.strip())
PY

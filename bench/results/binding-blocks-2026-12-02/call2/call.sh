#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash of 5fb18dc (main with `bench attention
# --blocks`), .dev/distflash-*.whl of 1f5cb81.
# 1. Issue 18's per-block rates: the diagonal and off-diagonal blocks of 4 and 8 workers'
#    chunks beside the whole sequence, bf16, 32 heads, d128.
# 2. Issue 21's speed: the binary at 4K/16K/64K, d128 and d64, then torch_binding.py's speed
#    part (chained training steps and isolated calls) against those lines.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
.dev/distflash bench attention --device cuda --seqs 32768,131072 --head-dims 128 --heads 32 --blocks 4 --json $OUT/blocks4.jsonl > $OUT/blocks.log 2>&1; echo "blocks4 exit $?"
.dev/distflash bench attention --device cuda --seqs 131072 --head-dims 128 --heads 32 --blocks 8 --json $OUT/blocks8.jsonl >> $OUT/blocks.log 2>&1; echo "blocks8 exit $?"
grep -ho '"impl":"[a-z_]*"\|"block":"[a-z_]*"\|"seq":[0-9]*\|"chunk":[0-9]*\|"fwd_tflops":[0-9.]*\|"bwd_tflops":[0-9.]*\|"fwdbwd_over_whole":[0-9.]*' $OUT/blocks4.jsonl $OUT/blocks8.jsonl | paste -sd' ' | sed 's/"impl"/\n"impl"/g'
echo
python3 -m pip install --quiet --disable-pip-version-check --no-deps --target /tmp/distflash-py .dev/distflash-*.whl
export PYTHONPATH=/tmp/distflash-py
.dev/distflash bench attention --device cuda --seqs 4096,16384,65536 --head-dims 128,64 --json $OUT/distflash.jsonl > /dev/null 2>&1; echo "bench exit $?"
(cd bench/peers && timeout 300 python3 -c "
import json, torch_binding as t
rows, ok = t.speed('$OUT/distflash.jsonl', 32)
json.dump({'speed': rows, 'speed_passed': ok}, open('$OUT/binding_speed.json', 'w'), indent=1)
") > $OUT/binding_speed.log 2>&1; echo "speed exit $?"
python3 - $OUT/binding_speed.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["speed"]:
    print(r["seq"], r["head_dim"], "binary %.3f" % (r["binary_fwd_ms"] + r["binary_bwd_ms"]),
          "chained hm %.3f (%.3fx) bshd %.3f (%.3fx)" % (r["chained_head_major_step_ms"], r["head_major_over_binary"], r["chained_bshd_step_ms"], r["bshd_over_binary"]),
          "isolated hm %.3fx bshd %.3fx" % (r["isolated_head_major_over_binary"], r["isolated_bshd_over_binary"]))
PY

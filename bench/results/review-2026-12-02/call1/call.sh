#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/distflash and the wheel of e731fc4, after
# the review's refactors: the binding's lent copies through lend/give_back (dist_binding.sh),
# binding_profile.py on torch_binding's chained_ms, --shard grads by reduce_scatter_into on
# virtual workers (startup_checks' shard section), join_results (attention --workers 2 --check).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
timeout 200 bash bench/peers/dist_binding.sh > $OUT/dist_binding.log 2>&1; echo "dist_binding: exit $?"; tail -n 1 $OUT/dist_binding.log
timeout 100 python3 bench/peers/binding_profile.py --seqs 4096 --out $OUT/binding_profile.json > $OUT/binding_profile.log 2>&1; echo "binding_profile: exit $?"
python3 -c "import json; [print(r['impl'], round(r['event_ms'], 3), round(r['kernel_ms'], 3)) for r in json.load(open('$OUT/binding_profile.json'))]"
mkdir -p $OUT/shard; OUT=$OUT/shard SECTIONS=shard timeout 200 bash bench/peers/startup_checks.sh > /dev/null 2>&1; echo "shard section: exit $?"
grep -iE "pass|fail" $OUT/shard/startup.log | tail -n 6
.dev/distflash attention --device cuda --workers 2 --seq-len 4000 --heads 8 --kv-heads 2 --head-dim 128 --check --json > $OUT/attention_check.json 2>&1; echo "attention --workers 2 --check: exit $? $(grep -o '"passed": [a-z]*' $OUT/attention_check.json)"

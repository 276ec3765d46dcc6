#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]. Builds:
#   v29 = .dev/v29/ (call 4's build)
#   v30 = .dev/     v29 with the lazy rescale at head dim 64 too (LAZY_RESCALE); its d64 PTX is
#                    identical to call 3's v28 (timed there at +1.4%, and tested), the rest to v29's.
# Prediction, written before the call: the d64 forward +1-2% (call 3: 433, 432 -> 438, 439 at
# 32K); nothing else moves.
# 1. gpu_timing attention, v29 / v30 alternated twice: d64 at 8K, 32K and 128K;
# 2. the d64 rows of issue 18's table for v30, beside SDPA (FA2, cuDNN), at 4K, 8K, 32K, 128K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R/hd
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
pack() { tar czf $OUT/runs.tgz -C $OUT runs; }
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v30) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in v29 v30; do
    timeout 60 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 64 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d64: exit $? $(sum $R/a_${v}_$round.jsonl)"
  done
done
pack
D=.dev/distflash
timeout 60 $D bench attention --device cuda --seqs 4096,8192,32768,131072 --head-dims 64 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "d64 ours: exit $?"
timeout 90 python3 bench/peers/sdpa_bench.py --seqs 4096,8192,32768,131072 --head-dims 64 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "d64 sdpa: exit $?"
$D bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md; pack
rm -rf $R

#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]: CTAs in groups of heads, and the review's helper for
# step 1 (timing only). Builds:
#   base = .dev/base/gpu_timing (main 60524d7, v19)
#   ref  = base with step 1's Sᵀ and dPᵀ issue loops as one helper (`head_dim_product`)
#   grp  = ref with cta_work's head-by-head order in groups of max(1, 132 / tiles) heads, tile by
#          tile within a group (132 hard-coded: the H200's SMs; forward and backward)
# Prediction (grp against ref): backward +10% at 4K, +4% at 8K, level from 16K on; forward
# +5-10% at 4K, +2% at 8K. ref against base: level.
# gpu_timing attention, builds alternated twice: d128 4K, 8K, 16K, 32K; d64 8K.
set -u
R=$OUT/runs; mkdir -p $R
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
for round in 1 2; do
  for v in base ref grp; do
    timeout 60 .dev/$v/gpu_timing attention --seqs 4096,8192,16384,32768 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 30 .dev/$v/gpu_timing attention --seqs 8192 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]: the dQ reductions' cost, split (timing only; the
# ablated builds compute wrong dQ on purpose). Builds (main 60524d7, v19):
#   base  = .dev/base/gpu_timing, as committed
#   nored  = base without dQ's TMA reductions (as in call 1)
#   nowait = base without the wait for the last tile's reductions to have read dQ's staging tile
#            (bulk_wait_read before the dSᵀ barrier): the next stores may overwrite it
#   half   = base with only warpgroup 0's reductions (half of dQ's reduction traffic)
#   late   = base with that wait moved from before the dSᵀ barrier to just before the dQ stores,
#            in each warpgroup's first thread, the warpgroup then meeting at a named barrier
#            (a candidate: correct, no ablation)
# gpu_timing attention, builds alternated twice: d128 32K, 128K; d64 32K.
set -u
R=$OUT/runs; mkdir -p $R
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
for round in 1 2; do
  for v in base nowait half late nored; do
    timeout 60 .dev/$v/gpu_timing attention --seqs 32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 30 .dev/$v/gpu_timing attention --seqs 32768 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev/gpu_timing", ".dev/db"]: the session's last device
# seconds, timing only (not landed: no exactness run fitted). Builds:
#   tw = .dev/gpu_timing (main d2b3740, kernels v19)
#   db = .dev/db/gpu_timing: tw with dQ's staging tile double-buffered (`db.diff`): a tile's
#        stores wait only for the reduction of two tiles back (`cp.async.bulk.wait_group.read 1`)
#        before the dSᵀ barrier, instead of the last tile's; +32 KiB of shared memory at d128
# gpu_timing attention, tw / db alternated twice: d128 8K, 32K, 128K; d64 8K, 32K.
set -u
R=$OUT/runs; mkdir -p $R
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in tw) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in tw db; do
    timeout 40 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 20 $(tbin $v) attention --seqs 8192,32768 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>&1
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

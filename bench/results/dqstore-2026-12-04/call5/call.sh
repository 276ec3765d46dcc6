#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]. Builds: base = .dev/base/ (v22, 88cc876),
# v23 = .dev/ (c7940b6). The deterministic backward at d256, 8K and 32K, the builds alternated
# twice (calls 3 and 4 had v23's at 32K at 245-247, where v22's call 3 of wide-2026-12-04 had 268).
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache DISTFLASH_TUNING=deterministic=true
R=$OUT/runs; mkdir -p $R
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v23) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in base v23; do
    timeout 100 $(tbin $v) attention --seqs 8192,32768 --head-dims 256 --json $R/det_${v}_$round.jsonl > /dev/null 2>$R/det_${v}_$round.err
    echo "deterministic $v round $round: exit $? $(sum $R/det_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

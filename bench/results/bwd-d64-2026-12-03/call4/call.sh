#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]: call 3's builds (t = .dev/t/, main a8b0458;
# tw = .dev/, each warpgroup issuing its own dQ reductions, what lands).
# 1. the masked d128 module, t / tw alternated twice: 128K, 16 documents of 8K, a 4096 window;
#    d80 at 32K, t / tw (gpu_timing);
# 2. tw beside SDPA (cuDNN, FlashAttention-2): head dims 64, 80, 96, 128, 192, 256 at 8K and 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in tw) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
dbin() { case $1 in tw) echo .dev/distflash;; *) echo .dev/$1/distflash;; esac; }
DOCS=$(python3 -c "print(','.join(['8192'] * 16))")
for round in 1 2; do
  for v in t tw; do
    timeout 60 $(dbin $v) bench attention --device cuda --seqs 131072 --head-dims 128 --doc-lens $DOCS --json $R/docs_${v}_$round.jsonl > $R/docs_${v}_$round.out 2>&1
    echo "docs $v round $round: exit $? $(sum $R/docs_${v}_$round.jsonl)"
    timeout 60 $(dbin $v) bench attention --device cuda --seqs 131072 --head-dims 128 --window 4096 --json $R/win_${v}_$round.jsonl > $R/win_${v}_$round.out 2>&1
    echo "window $v round $round: exit $? $(sum $R/win_${v}_$round.jsonl)"
    timeout 40 $(tbin $v) attention --seqs 32768 --head-dims 80 --json $R/p_${v}_$round.jsonl > /dev/null 2>&1
    echo "d80 $v round $round: exit $? $(sum $R/p_${v}_$round.jsonl)"
  done
done
mkdir -p $R/hd
timeout 90 .dev/distflash bench attention --device cuda --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "ours exit $?"
timeout 150 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "sdpa exit $?"
.dev/distflash bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

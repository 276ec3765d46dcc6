#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev/distflash", ".dev/gpu_timing", ".dev/prev",
# ".dev/qt", ".dev/sum"]. Builds (each `cargo build --release --bin distflash --example gpu_timing`):
#   prev = e1c8012 (before v18)
#   qt   = 98e7300 (v18 with Q and dO by TMA for padded tiles only; d128 and d64 keep cp.async)
#   t    = .dev/ (main a8b0458: v18, Q and dO by TMA at every head dim; 80 B spill, masked d128)
#   sum  = t with head dim 64's two dQ parts summed in shared memory (as the deterministic
#          mode does) and one TMA reduction per 32 columns instead of two (gpu_timing only)
# 1. The masked d128 module with its spill: `bench attention` at 128K, 16 documents of 8K and a
#    4096 window, prev / qt / t alternated twice;
# 2. d64 backward, t / sum alternated twice at 8K and 32K;
# 3. ncu of t's d64 backward at 32K: warp stalls per SASS instruction (SourceCounters).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
DOCS=$(python3 -c "print(','.join(['8192'] * 16))")
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
dbin() { case $1 in t) echo .dev/distflash;; *) echo .dev/$1/distflash;; esac; }
tbin() { case $1 in t) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in prev qt t; do
    timeout 120 $(dbin $v) bench attention --device cuda --seqs 131072 --head-dims 128 --doc-lens $DOCS --json $R/docs_${v}_$round.jsonl > $R/docs_${v}_$round.out 2>&1
    echo "docs $v round $round: exit $? $(sum $R/docs_${v}_$round.jsonl)"
    timeout 120 $(dbin $v) bench attention --device cuda --seqs 131072 --head-dims 128 --window 4096 --json $R/win_${v}_$round.jsonl > $R/win_${v}_$round.out 2>&1
    echo "window $v round $round: exit $? $(sum $R/win_${v}_$round.jsonl)"
  done
done
for round in 1 2; do
  for v in t sum; do
    timeout 60 $(tbin $v) attention --seqs 8192,32768 --head-dims 64 --json $R/d64_${v}_$round.jsonl > /dev/null 2>$R/d64_${v}_$round.err
    echo "d64 $v round $round: exit $? $(sum $R/d64_${v}_$round.jsonl)"
  done
done
timeout 200 ncu --kernel-name bwd_block --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $R/bwd .dev/gpu_timing attention --seqs 32768 --head-dims 64 > $R/ncu.out 2>&1
echo "ncu exit $?"
ncu --import $R/bwd.ncu-rep --page source --csv --print-source sass > $R/bwd_sass.csv 2>&1
ncu --import $R/bwd.ncu-rep --page details > $R/bwd_details.txt 2>&1
gzip $R/bwd_sass.csv; rm -f $R/bwd.ncu-rep
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

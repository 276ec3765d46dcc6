#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Build: call 1's (.dev/, main 556cfae plus the
# backward prologue in one place). Where the d128 backward's warps wait, now that call 1 put its
# five products' own ceiling at ~870 TFLOP/s (it runs at ~495): ncu's warp-state sampling per
# SASS instruction (WarpStateStats, SourceCounters) of one bwd_block launch at 32K (clocks not
# locked), and its speed of light.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
timeout 60 .dev/gpu_timing attention --seqs 32768 --head-dims 128 --json $R/t.jsonl > /dev/null 2>$R/t.err; echo "timing: exit $? $(cat $R/t.jsonl | python3 -c "
import json,sys
for r in map(json.loads, sys.stdin): print('d%d %dK fwd %.0f bwd %.0f' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']))")"
timeout 300 ncu --clock-control none --kernel-name bwd_block --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $R/bwd .dev/gpu_timing attention --seqs 32768 --head-dims 128 > $R/ncu.out 2>&1
echo "ncu exit $?"
ncu --import $R/bwd.ncu-rep --page source --csv --print-source sass > $R/bwd_sass.csv 2>&1
ncu --import $R/bwd.ncu-rep --page details > $R/bwd_details.txt 2>&1
gzip $R/bwd_sass.csv; rm -f $R/bwd.ncu-rep
grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles|Issued Warp|Active Warps|No Eligible" $R/bwd_details.txt | head -n 20
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]. Build: call 3's v24 (.dev/, committed as 79c6d14).
# 1. head dims 64, 80, 96, 192 and 256 at 4K and 128K beside SDPA (FA2, cuDNN), causal bf16,
#    batch 1, 32 heads (call 4 has them at 8K and 32K, and d128 at 4K-256K);
# 2. ncu's warp-state sampling per SASS instruction of v24's d128 backward at 32K, as call 2 did
#    for v23: where the time goes now.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R/hd
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
pack() { tar czf $OUT/runs.tgz -C $OUT runs; }
D=.dev/distflash
timeout 120 $D bench attention --device cuda --seqs 4096,131072 --head-dims 64,80,96,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "hd ours: exit $?"
timeout 240 python3 bench/peers/sdpa_bench.py --seqs 4096,131072 --head-dims 64,80,96,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "hd sdpa: exit $?"
$D bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md; pack
timeout 120 ncu --clock-control none --kernel-name bwd_block --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $R/bwd .dev/gpu_timing attention --seqs 32768 --head-dims 128 > $R/ncu.out 2>&1
echo "ncu exit $?"
ncu --import $R/bwd.ncu-rep --page source --csv --print-source sass > $R/bwd_sass.csv 2>&1
ncu --import $R/bwd.ncu-rep --page details > $R/bwd_details.txt 2>&1
gzip $R/bwd_sass.csv; rm -f $R/bwd.ncu-rep
grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles" $R/bwd_details.txt | head -n 10
pack && rm -rf $R

#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]. Build: .dev/ (kernels v21, call 3's pp; the
# forward is v20's). Why the d128 forward runs at ~670 TFLOP/s at 16K and ~620 from 32K on:
# 1. gpu_timing attention at d128 12K-64K (forward and backward rates);
# 2. ncu of fwd_final at 16K and at 32K, clocks not locked: speed of light, memory workload
#    (L2 hit rate, DRAM throughput), and the SM clock it ran at.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
timeout 90 .dev/gpu_timing attention --seqs 12288,16384,20480,24576,32768,49152,65536 --head-dims 128 --json $R/t.jsonl > /dev/null 2>$R/t.err; echo "timing: exit $? $(sum $R/t.jsonl)"
for s in 16384 32768; do
  timeout 120 ncu --clock-control none --kernel-name fwd_final --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis .dev/gpu_timing attention --seqs $s --head-dims 128 > $R/ncu_fwd_$s.txt 2>&1; echo "ncu fwd $s: exit $?"
  grep -E "SM Frequency|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|L2 Hit Rate|Memory Throughput" $R/ncu_fwd_$s.txt | head -n 10
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

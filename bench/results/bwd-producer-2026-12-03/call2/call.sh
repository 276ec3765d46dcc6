#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Builds:
#   v20 = .dev/v20/gpu_timing (main 2d629c1, kernels v20)
#   ws  = .dev/ws/gpu_timing (call 1's producer-warpgroup backward)
#   ov  = .dev/ (build_gpu_tests.sh): ws, and below head dim 128 dK's product runs into the
#         next tile (its stage is released after the next Sᵀ's wait) and the dSᵀ barrier is
#         each warpgroup's own at head dim 64 (its dQ reads only its own keys)
# 1. gpu_attention (ov), default kernels;
# 2. gpu_timing attention, v20 / ws / ov alternated twice: d128 8K, 32K, 128K; d64 8K, 32K;
#    d96 8K;
# 3. ncu of v20's d128 backward at 16K: speed of light, memory and compute workload (shared
#    memory and tensor pipe use).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in ov) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default (ov): exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_default.log | tail -n 8
for round in 1 2; do
  for v in v20 ws ov; do
    timeout 60 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 40 $(tbin $v) attention --seqs 8192,32768 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
    timeout 30 $(tbin $v) attention --seqs 8192 --head-dims 96 --json $R/n_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d96 $v round $round: exit $? $(sum $R/n_${v}_$round.jsonl)"
  done
done
timeout 150 ncu --kernel-name bwd_block --launch-skip 1 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy .dev/v20/gpu_timing attention --seqs 16384 --head-dims 128 > $R/ncu_v20.txt 2>&1; echo "ncu v20: exit $?"
grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput|Shared|Tensor|Issue Slots|Executed Ipc" $R/ncu_v20.txt | head -n 30
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

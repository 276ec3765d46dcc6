#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]: .dev/ = build_gpu_tests.sh of this change (the wgmma
# backward's Sᵀ and dPᵀ in two commit groups, Pᵀ's exponentials computed while dPᵀ's products
# run); .dev/prev/gpu_timing = the build of e1c8012 (main before it).
# 1. gpu_attention, default and deterministic;
# 2. gpu_timing attention, prev against new, alternated twice: d128 at 8K, 32K, 128K; d64 and
#    d96 at 32K;
# 3. ncu of the new backward at 32K, d128: warp stalls per SASS instruction (SourceCounters).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
for v in default det; do
  case $v in default) T="";; det) T=deterministic=true;; esac
  DISTFLASH_TUNING=$T LOG=$R/gpu_attention_$v.log TESTS=gpu_attention TIMEOUT=240 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention $v: exit $?"
  grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_$v.log | tail -n 6
done
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
bin() { case $1 in prev) echo .dev/prev/gpu_timing;; *) echo .dev/gpu_timing;; esac; }
for round in 1 2; do
  for v in prev new; do
    timeout 100 $(bin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 60 $(bin $v) attention --seqs 32768 --head-dims 64,96 --json $R/s_${v}_$round.jsonl > /dev/null 2>&1
    echo "d64/96 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
timeout 200 ncu --kernel-name bwd_block --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $R/bwd .dev/gpu_timing attention --seqs 32768 --head-dims 128 > $R/ncu.out 2>&1
echo "ncu exit $?"
ncu --import $R/bwd.ncu-rep --page source --csv --print-source sass > $R/bwd_sass.csv 2>&1
ncu --import $R/bwd.ncu-rep --page details > $R/bwd_details.txt 2>&1
grep -h "Duration\|Compute (SM) Throughput\|Warp Cycles Per Issued\|Issue Slots" $R/bwd_details.txt | head
rm -f $R/bwd.ncu-rep

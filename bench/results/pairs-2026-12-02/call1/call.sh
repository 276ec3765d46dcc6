#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/ of main + the CTA order change
# (build_gpu_tests.sh). Variants by DISTFLASH_TUNING (tests/gpu_common/tuning.rs):
#   old  = fwd-key-major=false,bwd-key-major=false,bwd-pairs=false  (the launch order until now)
#   km   = bwd-pairs=false                                           (head by head, unpaired)
#   new  = (the default: head by head, causal key tiles paired)
# 1. gpu_attention (every head dim, masks, blocks, lent memory) under new, then under km.
# 2. gpu_timing attention, d128 at 8K, 32K and 128K, variants alternated twice; d64 at 32K.
# 3. ncu (SpeedOfLight, MemoryWorkloadAnalysis) of the second bwd_block and fwd_final launch,
#    old and new, at 32K and 128K: DRAM throughput and L2 hit rate, the hypothesis being that
#    the backward's 415-425 TFLOP/s (and the forward's fall with length) is DRAM bandwidth,
#    because the CTAs running together sit on different query (key) tiles of every head.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
OLD=fwd-key-major=false,bwd-key-major=false,bwd-pairs=false
KM=bwd-pairs=false
for v in new km; do
  case $v in new) T="";; km) T=$KM;; esac
  DISTFLASH_TUNING=$T LOG=$R/gpu_attention_$v.log TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention $v: exit $?"
  grep -h "passed: worst\|test result\|FAIL\|panicked" $R/gpu_attention_$v.log | tail -n 6
done
for round in 1 2; do
  for v in old km new; do
    case $v in old) T=$OLD;; km) T=$KM;; new) T="";; esac
    DISTFLASH_TUNING=$T timeout 90 .dev/gpu_timing attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "$v round $round: exit $? $(python3 -c "
import json,sys
for r in map(json.loads, open('$R/t_${v}_$round.jsonl')): print('%dK fwd %.0f bwd %.0f (%.1f/%.1f ms);' % (r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['fwd_ms'], r['bwd_ms']), end=' ')" 2>&1)"
  done
done
for v in old new; do
  case $v in old) T=$OLD;; new) T="";; esac
  DISTFLASH_TUNING=$T timeout 60 .dev/gpu_timing attention --seqs 32768 --head-dims 64 --json $R/t64_$v.jsonl > /dev/null 2>&1
  echo "d64 $v: exit $? $(grep -o '"fwd_tflops":[0-9.]*\|"bwd_tflops":[0-9.]*' $R/t64_$v.jsonl | paste -sd' ')"
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
for v in old new; do
  case $v in old) T=$OLD;; new) T="";; esac
  for seq in 32768 131072; do
    for k in bwd_block fwd_final; do
      DISTFLASH_TUNING=$T timeout 150 $NCU --clock-control none -k regex:"^$k\$" -s 1 -c 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --csv --page details \
        .dev/gpu_timing attention --seqs $seq --head-dims 128 > $R/ncu_${v}_${seq}_$k.csv 2> $R/ncu_${v}_${seq}_$k.err
      echo "ncu $v $seq $k: exit $? $(grep -h '"DRAM Throughput"\|"L2 Hit Rate"\|"Duration"\|"Compute (SM) Throughput"\|"Memory Throughput"' $R/ncu_${v}_${seq}_$k.csv | awk -F'","' '{printf "%s=%s %s; ", $(NF-2), $NF, $(NF-1)}' | tr -d '"')"
    done
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

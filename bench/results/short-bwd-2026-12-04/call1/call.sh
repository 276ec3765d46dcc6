#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Diagnosis only, nothing kept from the build:
#   .dev/trace/gpu_timing = main a820dc7 with a scratch trace in bwd_block (not committed): thread
#   0 of each CTA reads clock64 at entry, once K and V have landed, after query tile 0, after
#   the last dQ turn and after the dK/dV stores, and on the 4th launch of the module prints them
#   with its SM (ptxas: 16 bytes of spill stores where main has 4).
# Question: why the d128 backward is 536 TFLOP/s at 8K and 559 at 16K but 578-584 from 32K.
# Fitting rate = P·W/(W+X) to call 4's figures (W = a CTA's mean number of 64-row query tiles)
# gives X = 5-7 tiles (~14 us at 2.36 us a tile) of fixed cost per CTA. Prediction: the trace
# shows the steady per-tile time equal at 8K and 32K, and a fixed cost of that size made of the
# prologue (entry to K/V landed), the first tile, the epilogue (stores) and the gap between CTAs
# on an SM; which of them dominates is the question.
# Part 2: the forward's clock. The d128 forward is 654 at 8K and 625-630 from 32K; is the SM
# clock lower in long runs (power)? nvidia-smi samples clocks and power while gpu_timing runs the
# forward+backward at 8K, then at 128K.
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $R/gpu.txt
T=.dev/trace/gpu_timing
for s in 8192 16384 32768; do
  timeout 120 $T attention --seqs $s --head-dims 128 > $R/trace_$s.txt 2>$R/trace_$s.err
  echo "trace $s: exit $? lines $(grep -c TRACE $R/trace_$s.txt) $(grep -v TRACE $R/trace_$s.txt | head -c 300)"
done
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 > $R/clocks.csv &
SMI=$!
sleep 1
for s in 8192 131072 8192; do
  echo "start $s $(date +%H:%M:%S.%N)" >> $R/clock_marks.txt
  timeout 120 $T attention --seqs $s --head-dims 128 >> $R/clock_runs.jsonl 2>>$R/clock_runs.err
  echo "end $s $(date +%H:%M:%S.%N)" >> $R/clock_marks.txt
done
sleep 1; kill $SMI
cat $R/clock_marks.txt; tail -3 $R/clock_runs.jsonl | cut -c1-300
tar czf $OUT/runs.tgz -C $OUT runs

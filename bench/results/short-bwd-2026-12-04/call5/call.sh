#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]. Build: .dev/v31/gpu_timing (main 6a4acd9's
# kernels; the head's). Diagnosis only.
# Question: the d128 forward runs 640-656 TFLOP/s at 8K but 614-629 from 32K on (calls 2-4). Is
# that the SM clock (call 1 saw a 128K run's clock under 1900 MHz in 15% of its samples, power
# near the 700 W limit) or the kernel doing less per cycle at long lengths?
# Prediction, written before the call: per cycle (ncu's elapsed cycles, clocks not locked) the
# forward does the same work within 2% at 8K, 32K and 128K; in the timing runs the mean clock
# at 128K is ~3% under 8K's, about half of the rate's fall.
# 1. gpu_timing attention, d128, one process per length (8K, 32K, 128K), twice, with nvidia-smi
#    sampling the SM clock and power every 50 ms, each process's start and end marked;
# 2. ncu of fwd_final at 8K, 32K and 128K, clocks not locked: speed of light (duration, elapsed
#    cycles, SM frequency, SM throughput) and the compute workload (pipe utilisation).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
T=.dev/v31/gpu_timing
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv > $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 > $R/clocks.csv &
SMI=$!
sleep 1
for round in 1 2; do
  for s in 8192 32768 131072; do
    echo "start $s $(date +%H:%M:%S.%N)" >> $R/clock_marks.txt
    timeout 60 $T attention --seqs $s --head-dims 128 >> $R/t.jsonl 2>>$R/t.err
    echo "end $s $(date +%H:%M:%S.%N)" >> $R/clock_marks.txt
  done
done
sleep 1; kill $SMI
python3 -c "
import json
for r in map(json.loads, open('$R/t.jsonl')): print('%dK fwd %.0f bwd %.0f' % (r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']))"
tar czf $OUT/runs.tgz -C $OUT runs
for s in 8192 32768 131072; do
  timeout 120 ncu --clock-control none --kernel-name fwd_final --launch-skip 2 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis $T attention --seqs $s --head-dims 128 > $R/ncu_fwd_$s.txt 2>&1; echo "ncu fwd $s: exit $?"
  grep -E "Duration|Elapsed Cycles|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc Active" $R/ncu_fwd_$s.txt | sed 's/^ */  /'
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

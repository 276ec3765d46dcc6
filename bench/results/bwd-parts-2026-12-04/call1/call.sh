#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. NOT RUN YET: no device was lent on 2026-12-04
# after this was written (see ../README.md). Build: .dev/gpu_timing with
# ../backward-parts-timer.patch applied (alone, or with the persistent forward's patch:
# the backward's code is the same in both).
# Where the d128 backward's time goes at 4K-128K, MHA and GQA 32/8: D, the f32 accumulators
# cleared, the kernel alone, and the three together, each timed after a second of its own load.
# Prediction, written before the call: D plus the clearing ~3% of the whole at 8K (MHA: 128 MiB
# read, 128 MiB cleared, ~75 us of ~2.5 ms; GQA ~3.7%, its f32 dK and dV cleared too), ~1.5% at
# 16K, under 1% from 32K; the kernel alone ~565-570 TFLOP/s at 8K against the whole's 545-551,
# so the passes explain under half of the 8K backward's 6-7% shortfall against 16K's.
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
# One length a process, each start and end stamped, so that the SM clock sampled beside them
# (clocks.csv) can be read per length.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 200 > $R/clocks.csv &
SMI=$!
for kv in 32 8; do
  for seq in 4096 8192 16384 32768 131072; do
    echo "start kv $kv seq $seq $(date +%T.%N)" >> $R/stamps.txt
    timeout 100 .dev/gpu_timing backward-parts --seqs $seq --head-dims 128 --kv-heads $kv \
      --json $R/parts_kv${kv}_$seq.jsonl > $R/parts_kv${kv}_$seq.log 2>&1
    rc=$?
    echo "end kv $kv seq $seq $(date +%T.%N) exit $rc" >> $R/stamps.txt
    echo "kv_heads $kv seq $seq: exit $rc $(cat $R/parts_kv${kv}_$seq.jsonl 2>/dev/null)"
  done
done
kill $SMI
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

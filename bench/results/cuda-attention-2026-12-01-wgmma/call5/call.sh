set -u
export DISTFLASH_CACHE_DIR=/tmp/dc
timeout 200 .dev/cuda_attn check > $OUT/check.log 2>&1; echo "check exit $?"; tail -2 $OUT/check.log
timeout 100 .dev/cuda_attn bench --seqs 16384,65536 --head-dims 128 --json $OUT/v7.jsonl 2>&1 | cut -c 200-400
timeout 300 ncu --kernel-name regex:"bwd_block" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
  .dev/cuda_attn bench --seqs 8192 --head-dims 128 > $OUT/ncu_bwd.txt 2>&1
timeout 300 ncu --kernel-name regex:"fwd_final" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
  .dev/cuda_attn bench --seqs 8192 --head-dims 128 > $OUT/ncu_fwd.txt 2>&1
grep -E "Tensor is|Issue Slots Busy|Warp Cycles Per Issued|Stall|L1/TEX Cache Throughput|Registers" $OUT/ncu_*.txt

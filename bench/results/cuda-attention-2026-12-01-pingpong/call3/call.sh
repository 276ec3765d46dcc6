set -u
export DISTFLASH_CACHE_DIR=/tmp/dc
B=.dev/v_pp/cuda_attn
$B bench --seqs 8192 --head-dims 128 > /dev/null 2>&1
for k in fwd_final bwd_block; do
  timeout 200 ncu --kernel-name $k --launch-skip 2 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio -o $OUT/$k $B bench --seqs 8192 --head-dims 128 > $OUT/ncu_$k.log 2>&1
  ncu --import $OUT/$k.ncu-rep --page source --csv --print-source sass > $OUT/${k}_sass.csv 2>&1
  ncu --import $OUT/$k.ncu-rep --page details --print-details all > $OUT/${k}_details.txt 2>&1
  grep -E "stalled_.*ratio" $OUT/${k}_details.txt | sort -k3 -n -r | head -12
done
cd $OUT && tar czf prof.tgz *.csv *_details.txt *.log && rm -f *.csv *_details.txt *.log; ls -la $OUT

set -u; export DISTFLASH_CACHE_DIR=/tmp/dc
which ncu; ncu --version | tail -1
timeout 240 ncu --clock-control none -k regex:"bwd_block|fwd_final" -c 2 --set full -o $OUT/prof ./cuda_attn bench --seqs 8192 --head-dims 128 > $OUT/ncu_run.log 2>&1; echo "ncu rc=$?"; tail -5 $OUT/ncu_run.log
ncu --import $OUT/prof.ncu-rep --page details --print-units base > $OUT/details.txt 2>&1; wc -l $OUT/details.txt
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/sass_bwd.csv 2>/dev/null; wc -c $OUT/sass_bwd.csv
grep -E "bwd_block|fwd_final|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Shared Memory|Issue Slots|Executed Ipc|Stall|L1/TEX Hit|Bank" $OUT/details.txt | head -80

#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]. Builds:
#   t  = .dev/t/ (main a8b0458, kernels v18)
#   g  = .dev/g/gpu_timing: t with dQ staged in groups of 8 f32 columns × 64 rows, unswizzled
#        (a 5-d tensor map), so that a quarter warp's accumulator store covers the 32 banks once
#        (ncu, call 1: every dQ STS.64 took 4 wavefronts for 2); one TMA reduction per 64
#        columns instead of per 32
#   gw = .dev/ (build_gpu_tests.sh of this change): g, with each warpgroup's first thread
#        issuing the reduction of the columns it stored, and at head dim 64 (each warpgroup's
#        dQ product reads its own keys into its own part) a warpgroup barrier instead of the
#        CTA's before dQ
# 1. gpu_timing attention, t / g / gw alternated twice: d128 8K, 32K, 128K; d64 8K, 32K; d80, d96 32K;
# 2. the masked d128 module, t / gw alternated twice: 128K, 16 documents of 8K, a 4096 window;
# 3. gpu_attention (gw): everything with the default kernels; the oracle and repeat checks with
#    the deterministic backward;
# 4. gw beside SDPA (cuDNN, FlashAttention-2): head dims 64, 80, 96, 128, 192, 256 at 8K and 32K;
# 5. ncu of gw's d128 backward at 32K: warp stalls per SASS instruction.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in gw) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
dbin() { case $1 in gw) echo .dev/distflash;; *) echo .dev/$1/distflash;; esac; }
for round in 1 2; do
  for v in t g gw; do
    timeout 100 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 60 $(tbin $v) attention --seqs 8192,32768 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>&1
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
    timeout 60 $(tbin $v) attention --seqs 32768 --head-dims 80,96 --json $R/p_${v}_$round.jsonl > /dev/null 2>&1
    echo "d80/96 $v round $round: exit $? $(sum $R/p_${v}_$round.jsonl)"
  done
done
DOCS=$(python3 -c "print(','.join(['8192'] * 16))")
for round in 1 2; do
  for v in t gw; do
    timeout 120 $(dbin $v) bench attention --device cuda --seqs 131072 --head-dims 128 --doc-lens $DOCS --json $R/docs_${v}_$round.jsonl > $R/docs_${v}_$round.out 2>&1
    echo "docs $v round $round: exit $? $(sum $R/docs_${v}_$round.jsonl)"
    timeout 120 $(dbin $v) bench attention --device cuda --seqs 131072 --head-dims 128 --window 4096 --json $R/win_${v}_$round.jsonl > $R/win_${v}_$round.out 2>&1
    echo "window $v round $round: exit $? $(sum $R/win_${v}_$round.jsonl)"
  done
done
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=200 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_default.log | tail -n 6
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
mkdir -p $R/hd
timeout 90 .dev/distflash bench attention --device cuda --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "ours exit $?"
timeout 150 python3 bench/peers/sdpa_bench.py --seqs 8192,32768 --head-dims 64,80,96,128,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "sdpa exit $?"
.dev/distflash bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md
timeout 100 ncu --kernel-name bwd_block --launch-skip 1 --launch-count 1 --section WarpStateStats --section SourceCounters --section SpeedOfLight -o $R/bwd .dev/gpu_timing attention --seqs 32768 --head-dims 128 > $R/ncu.out 2>&1
echo "ncu exit $?"
ncu --import $R/bwd.ncu-rep --page source --csv --print-source sass > $R/bwd_sass.csv 2>&1
ncu --import $R/bwd.ncu-rep --page details > $R/bwd_details.txt 2>&1
gzip $R/bwd_sass.csv; rm -f $R/bwd.ncu-rep
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]. Builds:
#   base = .dev/base/gpu_timing (main 60524d7, kernels v19)
#   tw   = .dev/ (build_gpu_tests.sh of this change, kernels v20): the CTAs of heads with fewer
#          tiles than the device's SMs in groups of max(1, SMs / tiles) heads, tile by tile
#          within a group (NUM_SMS from the device), and step 1's issue loops as one helper;
#          call 3's `grp`, with the SM count from the device instead of 132 written in
# 1. gpu_attention (tw): everything with the default kernels (a new case of 48 heads whose
#    last group is partial); the oracle and repeat checks with the deterministic backward;
# 2. gpu_timing attention, base / tw alternated twice: d128 4K, 8K, 16K, 32K, 128K; d64 8K;
# 3. issue 18's tables, ours (tw) beside SDPA (FA2, cuDNN), causal bf16, batch 1, 32 heads,
#    d128, 4K-256K: MHA, then GQA 32/8;
# 4. the deterministic backward at d128 4K, 8K, 32K; the distributed blocks at 8K and 32K over
#    4 workers; head dims 64-256 at 8K beside SDPA.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
tbin() { case $1 in tw) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
LOG=$R/gpu_attention_default.log TESTS=gpu_attention TIMEOUT=130 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention default: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_default.log | tail -n 6
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=90 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|error:" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for round in 1 2; do
  for v in base tw; do
    timeout 60 $(tbin $v) attention --seqs 4096,8192,16384,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
    timeout 30 $(tbin $v) attention --seqs 8192 --head-dims 64 --json $R/s_${v}_$round.jsonl > /dev/null 2>>$R/t_${v}_$round.err
    echo "d64 $v round $round: exit $? $(sum $R/s_${v}_$round.jsonl)"
  done
done
D=.dev/distflash
SEQS=4096,8192,16384,32768,65536,131072,262144
mkdir -p $R/mha $R/gqa $R/extra $R/hd
timeout 80 $D bench attention --device cuda --seqs $SEQS --head-dims 128 --json $R/mha/ours.jsonl > $R/mha/ours.log 2>&1; echo "mha ours: exit $?"
timeout 100 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --json $R/mha/sdpa.jsonl > $R/mha/sdpa.log 2>&1; echo "mha sdpa: exit $?"
$D bench report --results $R/mha --out $R/mha/RESULTS.md; grep "^| [0-9]" $R/mha/RESULTS.md
timeout 80 $D bench attention --device cuda --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/ours.jsonl > $R/gqa/ours.log 2>&1; echo "gqa ours: exit $?"
timeout 100 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/sdpa.jsonl > $R/gqa/sdpa.log 2>&1; echo "gqa sdpa: exit $?"
$D bench report --results $R/gqa --out $R/gqa/RESULTS.md; grep "^| [0-9]" $R/gqa/RESULTS.md
timeout 40 $D bench attention --device cuda --deterministic --seqs 4096,8192,32768 --head-dims 128 --json $R/extra/det128.jsonl > $R/extra/det128.log 2>&1; echo "det d128: exit $? $(sum $R/extra/det128.jsonl)"
timeout 40 $D bench attention --device cuda --seqs 8192,32768 --head-dims 128 --blocks 4 --json $R/extra/blocks4.jsonl > $R/extra/blocks4.log 2>&1; echo "blocks 4: exit $?"
grep -h "block" $R/extra/blocks4.log | head -n 12
timeout 40 $D bench attention --device cuda --seqs 8192 --head-dims 64,80,96,128,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "hd ours exit $?"
timeout 60 python3 bench/peers/sdpa_bench.py --seqs 8192 --head-dims 64,80,96,128,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "hd sdpa exit $?"
$D bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

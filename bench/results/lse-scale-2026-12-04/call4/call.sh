#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]. Build: kernels v29 (.dev/): call 1's v26 backward
# and call 3's v28 forward at head dims 192 and 256 (the lazy rescale), v26's forward at the
# others; PTX identical, variant by variant, to the builds timed and tested in calls 1-3.
# 1. issue 18's tables, ours beside SDPA (FA2, cuDNN), causal bf16, batch 1, 32 heads: d128 at
#    4K-256K, MHA then GQA 32/8;
# 2. the deterministic backward at d128 and d256 (8K, 32K); the distributed blocks over 4
#    workers at d128 32K;
# 3. head dims 64-256 at 4K, 8K, 32K and 128K.
# The runs are packed after each part, so that a call cut short keeps what it finished.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
pack() { tar czf $OUT/runs.tgz -C $OUT runs; }
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
D=.dev/distflash
SEQS=4096,8192,16384,32768,65536,131072,262144
mkdir -p $R/mha $R/gqa $R/extra $R/hd
timeout 80 $D bench attention --device cuda --seqs $SEQS --head-dims 128 --json $R/mha/ours.jsonl > $R/mha/ours.log 2>&1; echo "mha ours: exit $?"
timeout 100 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --json $R/mha/sdpa.jsonl > $R/mha/sdpa.log 2>&1; echo "mha sdpa: exit $?"
$D bench report --results $R/mha --out $R/mha/RESULTS.md; grep "^| [0-9]" $R/mha/RESULTS.md; pack
timeout 80 $D bench attention --device cuda --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/ours.jsonl > $R/gqa/ours.log 2>&1; echo "gqa ours: exit $?"
timeout 100 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/sdpa.jsonl > $R/gqa/sdpa.log 2>&1; echo "gqa sdpa: exit $?"
$D bench report --results $R/gqa --out $R/gqa/RESULTS.md; grep "^| [0-9]" $R/gqa/RESULTS.md; pack
timeout 60 $D bench attention --device cuda --deterministic --seqs 8192,32768 --head-dims 128,256 --json $R/extra/det.jsonl > $R/extra/det.log 2>&1; echo "det d128/d256: exit $? $(sum $R/extra/det.jsonl)"
timeout 40 $D bench attention --device cuda --seqs 32768 --head-dims 128 --blocks 4 --json $R/extra/blocks4.jsonl > $R/extra/blocks4.log 2>&1; echo "blocks 4 d128: exit $?"
grep -h "block" $R/extra/blocks4.log | head -n 6
pack
timeout 150 $D bench attention --device cuda --seqs 4096,8192,32768,131072 --head-dims 64,80,96,128,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "hd ours: exit $?"
timeout 250 python3 bench/peers/sdpa_bench.py --seqs 4096,8192,32768,131072 --head-dims 64,80,96,128,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "hd sdpa: exit $?"
$D bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md; pack
rm -rf $R

#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]. Build: .dev/ (build_gpu_tests.sh), kernels v23 as
# committed (c7940b6; call 3's build).
# 1. head dims 64, 80, 96, 192 and 256 at 4K and 128K, ours beside SDPA (FA2, cuDNN), causal
#    bf16, batch 1, 32 heads (call 3 has them at 8K and 32K, and d128 at 4K-256K);
# 2. the deterministic backward at d192 and d256, 32K, again (call 3 had d256 32K at 245).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R/hd $R/extra
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['bwd_ms']), end=' ')" 2>&1; echo; }
D=.dev/distflash
timeout 120 $D bench attention --device cuda --seqs 4096,131072 --head-dims 64,80,96,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.out 2>&1; echo "hd ours: exit $?"
timeout 240 python3 bench/peers/sdpa_bench.py --seqs 4096,131072 --head-dims 64,80,96,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.out 2>&1; echo "hd sdpa: exit $?"
$D bench report --results $R/hd --out $R/hd/RESULTS.md && grep "^| [0-9]" $R/hd/RESULTS.md
timeout 60 $D bench attention --device cuda --deterministic --seqs 32768 --head-dims 192,256 --json $R/extra/det.jsonl > $R/extra/det.log 2>&1; echo "det d192/d256: exit $? $(sum $R/extra/det.jsonl)"
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

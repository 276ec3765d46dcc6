#!/usr/bin/env bash
# Device call 3 (nvidia-h200), carry [".dev"]: .dev/ = this change after call 2, where the
# deterministic backward's turns at query tiles a key tile does not see are taken only where
# the block holds global keys (masks without them keep the count without those turns).
# 1. gpu_attention with every backend deterministic (the masked cases with and without global
#    tokens against the f64 oracle; the repeat test with documents alone and a window alone);
# 2. `distflash bench attention` at 32K, d128, default and --deterministic: 16 random documents,
#    a 4096-token window, and the window with 4 global tokens (which still take those turns).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=300 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention det: exit $?"
grep -h "passed: worst\|test result\|FAIL\|panicked\|three runs\|Error\|error:" $R/gpu_attention_det.log | tail -n 24
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('%s %s d%d %dK fwd %.0f bwd %.0f (%.2f/%.2f ms);' % (r['impl'], r['mask'], r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['fwd_ms'], r['bwd_ms']), end=' ')" 2>&1; echo; }
for det in "" --deterministic; do
  n=${det:+det}; n=${n:-default}
  timeout 60 .dev/distflash bench attention --seqs 32768 --head-dims 128 --docs random:16 $det --json $R/docs_$n.jsonl > /dev/null 2>&1; echo "docs $n: exit $? $(sum $R/docs_$n.jsonl)"
  timeout 60 .dev/distflash bench attention --seqs 32768 --head-dims 128 --window 4096 $det --json $R/window_$n.jsonl > /dev/null 2>&1; echo "window $n: exit $? $(sum $R/window_$n.jsonl)"
  timeout 90 .dev/distflash bench attention --seqs 32768 --head-dims 128 --window 4096 --global 4 $det --json $R/global_$n.jsonl > /dev/null 2>&1; echo "window+global $n: exit $? $(sum $R/global_$n.jsonl)"
done

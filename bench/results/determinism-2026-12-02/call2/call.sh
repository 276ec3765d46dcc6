#!/usr/bin/env bash
# Device call 2 (nvidia-h200), carry [".dev"]: .dev/ = this change, .dev/old/gpu_timing = main
# before it (bb0c275, built the same way). Speed, `gpu_timing attention` (d128 unless named,
# 32 heads, bf16, causal; CUDA events, median of repeats):
# 1. old and new alternated twice at 8K, 32K and 128K: the reordered backward (dV issued before
#    the barrier, dQ's store under dK's product);
# 2. old and new at d64 32K and d256 8K (d256's mma.sync backward now spills 12 bytes);
# 3. the deterministic backward (DISTFLASH_TUNING=deterministic=true) at 8K, 32K, 128K and d64
#    32K, then `distflash bench attention --deterministic` against the default for GQA 32/8
#    and for a masked sequence (16 documents; a 4096-token window) at 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('%s d%d %dK fwd %.0f bwd %.0f (%.2f/%.2f ms);' % (r.get('impl','gpu_timing'), r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['fwd_ms'], r['bwd_ms']), end=' ')" 2>&1; echo; }
bin() { case $1 in old) echo .dev/old/gpu_timing;; *) echo .dev/gpu_timing;; esac; }
for round in 1 2; do
  for v in old new; do
    timeout 100 $(bin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/t_${v}_$round.jsonl > /dev/null 2>$R/t_${v}_$round.err
    echo "$v round $round: exit $? $(sum $R/t_${v}_$round.jsonl)"
  done
done
for v in old new; do
  timeout 60 $(bin $v) attention --seqs 32768 --head-dims 64 --json $R/t64_$v.jsonl > /dev/null 2>&1; echo "d64 $v: exit $? $(sum $R/t64_$v.jsonl)"
  timeout 60 $(bin $v) attention --seqs 8192 --head-dims 256 --json $R/t256_$v.jsonl > /dev/null 2>&1; echo "d256 $v: exit $? $(sum $R/t256_$v.jsonl)"
done
DISTFLASH_TUNING=deterministic=true timeout 150 .dev/gpu_timing attention --seqs 8192,32768,131072 --head-dims 128 --json $R/det128.jsonl > /dev/null 2>$R/det128.err
echo "deterministic d128: exit $? $(sum $R/det128.jsonl)"
DISTFLASH_TUNING=deterministic=true timeout 60 .dev/gpu_timing attention --seqs 32768 --head-dims 64 --json $R/det64.jsonl > /dev/null 2>&1
echo "deterministic d64: exit $? $(sum $R/det64.jsonl)"
for det in "" --deterministic; do
  n=${det:+det}; n=${n:-default}
  timeout 60 .dev/distflash bench attention --seqs 32768 --head-dims 128 --kv-heads 8 $det --json $R/gqa_$n.jsonl > /dev/null 2>&1; echo "gqa $n: exit $? $(sum $R/gqa_$n.jsonl)"
  timeout 60 .dev/distflash bench attention --seqs 32768 --head-dims 128 --docs random:16 $det --json $R/docs_$n.jsonl > /dev/null 2>&1; echo "docs $n: exit $? $(sum $R/docs_$n.jsonl)"
  timeout 60 .dev/distflash bench attention --seqs 32768 --head-dims 128 --window 4096 $det --json $R/window_$n.jsonl > /dev/null 2>&1; echo "window $n: exit $? $(sum $R/window_$n.jsonl)"
done

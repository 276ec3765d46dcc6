#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]: .dev/ = this change after call 3, where the
# deterministic wgmma backward passes a query tile's dQ turn one tile later, after waiting for
# all but the latest tile's bulk reductions (cp.async.bulk.wait_group 1), instead of waiting
# for every reduction to reach dQ on every tile; the turn helpers renamed (wait_add_turn,
# pass_add_turn). .dev/prev/gpu_timing = the build of call 3 (commit 0752676).
# 1. gpu_attention deterministic, then default;
# 2. `gpu_timing attention` deterministic, prev against new, alternated twice: d128 at 8K, 32K,
#    128K and d64 at 32K; then the default backward of both at 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
for v in det default; do
  case $v in default) T="";; det) T=deterministic=true;; esac
  DISTFLASH_TUNING=$T LOG=$R/gpu_attention_$v.log TESTS=gpu_attention TIMEOUT=300 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention $v: exit $?"
  grep -h "passed: worst\|test result\|FAIL\|panicked\|Error\|error:" $R/gpu_attention_$v.log | tail -n 8
  grep -h "three runs" $R/gpu_attention_$v.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
done
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f (%.2f/%.2f ms);' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops'], r['fwd_ms'], r['bwd_ms']), end=' ')" 2>&1; echo; }
bin() { case $1 in prev) echo .dev/prev/gpu_timing;; *) echo .dev/gpu_timing;; esac; }
for round in 1 2; do
  for v in prev new; do
    DISTFLASH_TUNING=deterministic=true timeout 120 $(bin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/det_${v}_$round.jsonl > /dev/null 2>$R/det_${v}_$round.err
    echo "deterministic $v round $round: exit $? $(sum $R/det_${v}_$round.jsonl)"
    DISTFLASH_TUNING=deterministic=true timeout 60 $(bin $v) attention --seqs 32768 --head-dims 64 --json $R/det64_${v}_$round.jsonl > /dev/null 2>&1
    echo "deterministic d64 $v round $round: exit $? $(sum $R/det64_${v}_$round.jsonl)"
  done
done
for v in prev new; do
  timeout 60 $(bin $v) attention --seqs 32768 --head-dims 128 --json $R/default_$v.jsonl > /dev/null 2>&1
  echo "default $v: exit $? $(sum $R/default_$v.jsonl)"
done

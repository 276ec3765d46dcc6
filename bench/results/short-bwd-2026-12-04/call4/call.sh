#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]. Builds:
#   v31 = .dev/v31/ (main 6a4acd9, call 3's build)
#   v32 = .dev/     v31 plus: the wgmma forward's O (fwd_final) leaves through shared memory, as
#                    v31's backward's dK and dV do: each computing warpgroup stages its 64 rows,
#                    normalised, over its own rows of Q's tile (read only by its own products,
#                    all complete) in the TMA boxes' 128-byte swizzle, then writes whole rows in
#                    16-byte vectors, where each thread stored 32 pairs of 4 bytes, 8 rows a
#                    warp-wide store. The running-state entry (fwd_state) is unchanged. SASS: no
#                    spill; the loop region between the first and last wgmma unchanged at every
#                    head dim (the masked d128 module's first tile +180 instructions, once a CTA).
# Prediction, written before the call: the forward's O took ~half the backward's 10K cycles a
# CTA; a d128 forward CTA at 8K runs ~110K cycles, so +3-4% at 8K, ~+1% at 32K, ~+0.2% at 128K
# (unless, as in v31's backward, more than the epilogue moves); d64 about the same; d192 and
# d256 (their O rows 24 and 32 chunks) +3-5% at 8K. The backward unchanged.
# 1. gpu_timing attention, v31 / v32 alternated twice: d128 at 8K, 16K, 32K and 128K; d64, d96,
#    d192, d256 at 8K and 32K;
# 2. GPU tests on v32: gpu_attention (every case), gpu_model_attention.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK fwd %.0f bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['fwd_tflops'], r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in v32) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
for round in 1 2; do
  for v in v31 v32; do
    timeout 100 $(tbin $v) attention --seqs 8192,16384,32768,131072 --head-dims 128 --json $R/a_${v}_$round.jsonl > /dev/null 2>$R/a_${v}_$round.err
    echo "$v round $round d128: exit $? $(sum $R/a_${v}_$round.jsonl)"
    timeout 100 $(tbin $v) attention --seqs 8192,32768 --head-dims 64,96,192,256 --json $R/b_${v}_$round.jsonl > /dev/null 2>$R/b_${v}_$round.err
    echo "$v round $round others: exit $? $(sum $R/b_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs
LOG=$R/gpu_tests.log TESTS="gpu_attention gpu_model_attention" TIMEOUT=200 bash bench/peers/gpu_tests.sh > $R/gpu_tests.out 2>&1; echo "gpu_attention, gpu_model_attention (v32): exit $?"; cat $R/gpu_tests.out
grep -h "test result\|FAIL\|panicked" $R/gpu_tests.log | tail -n 4
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 1 (nvidia-h200), carry [".dev"]. Builds (kernels only differ):
#   base = .dev/base/ (main 88cc876, kernels v22)
#   st   = .dev/st/   dQ's staging stores without bank conflicts: at step k of a 32-column box
#          each thread stores its accumulator tile k ^ (g % 4) (selects), so that a half warp's
#          64-bit stores cover four distinct chunk pairs (rows g and g ^ 1 shared banks: four
#          wavefronts a store instead of two). Every wgmma backward (narrow and wide).
#   new  = .dev/      st, and the wide backward at 192 reading dSᵀ's fragments while dV runs
#          (as cd2174d did; e62ded2 moved it after dV's wait at every wide head dim)
# 1. a first timing of new (a hang shows as exit 124);
# 2. gpu_attention fast path against the f64 oracle (new), default and deterministic, and the
#    deterministic repeats;
# 3. gpu_timing attention, base / st / new alternated twice: d128 8K, 32K, 128K; d64, d96 32K;
#    d192, d256 8K, 32K.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
sum() { python3 -c "
import json,sys
for r in map(json.loads, open('$1')): print('d%d %dK bwd %.0f;' % (r['head_dim'], r['seq']//1024, r['bwd_tflops']), end=' ')" 2>&1; echo; }
tbin() { case $1 in new) echo .dev/gpu_timing;; *) echo .dev/$1/gpu_timing;; esac; }
timeout 60 .dev/gpu_timing attention --seqs 8192 --head-dims 128 --json $R/first.jsonl > $R/first.out 2>&1; echo "first new: exit $? $(sum $R/first.jsonl)"
LOG=$R/gpu_attention_fast.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches > /dev/null 2>&1; echo "gpu_attention fast_path (new): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_fast.log | tail -n 3
DISTFLASH_TUNING=deterministic=true LOG=$R/gpu_attention_det.log TESTS=gpu_attention TIMEOUT=150 bash bench/peers/gpu_tests.sh fast_path_matches repeats_to_the_bit > /dev/null 2>&1; echo "gpu_attention det fast_path, repeats (new): exit $?"
grep -h "test result\|FAIL\|panicked" $R/gpu_attention_det.log | tail -n 3
grep -h "three runs" $R/gpu_attention_det.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
for round in 1 2; do
  for v in base st new; do
    timeout 120 $(tbin $v) attention --seqs 8192,32768,131072 --head-dims 128 --json $R/d128_${v}_$round.jsonl > /dev/null 2>$R/d128_${v}_$round.err
    echo "d128 $v round $round: exit $? $(sum $R/d128_${v}_$round.jsonl)"
    timeout 90 $(tbin $v) attention --seqs 32768 --head-dims 64,96 --json $R/narrow_${v}_$round.jsonl > /dev/null 2>$R/narrow_${v}_$round.err
    echo "d64/96 $v round $round: exit $? $(sum $R/narrow_${v}_$round.jsonl)"
    timeout 90 $(tbin $v) attention --seqs 8192,32768 --head-dims 192,256 --json $R/wide_${v}_$round.jsonl > /dev/null 2>$R/wide_${v}_$round.err
    echo "d192/256 $v round $round: exit $? $(sum $R/wide_${v}_$round.jsonl)"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

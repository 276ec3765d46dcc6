#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]. Build: v34 (main 8b058e2's kernels), its
# gpu_timing with `spread --back-to-back` (each run of a round still timed, by consecutive
# events, with no wait between runs: run_times_ms in src/backend/cuda/timing.rs, which
# median_ms, the tables' timer, now uses too).
# Question (call 4): alone, the 8K backward runs ~625 TFLOP/s; the tables' back-to-back median
# 560-618. Is it the moment (the runs slow down as the load goes on: clock, power) or the runs'
# interaction (each run slower once it follows another at once: L2 left dirty, launch order)?
# Prediction, written before the call: the interaction: back to back, every run after the first
# at ~2.4 ms (~570) from the second on, not a slow decline.
# 1. gpu_timing spread --back-to-back: 8K, 4 rounds of 30 runs; 16K, 3 rounds of 12;
# 2. the same alone (a sync between runs): 8K, 2 rounds of 30;
# 3. gpu_timing attention at 8K in 3 fresh processes (the tables' timer after its change).
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
.dev/gpu_timing attention --seqs 4096 --head-dims 128 > /dev/null 2>&1  # compile, warm
timeout 120 .dev/gpu_timing spread --back-to-back --seq 8192 --rounds 4 --reps 30 > $R/b2b_8k.jsonl 2> $R/b2b_8k.err; echo "back to back 8K: exit $?"
timeout 120 .dev/gpu_timing spread --back-to-back --seq 16384 --rounds 3 --reps 12 > $R/b2b_16k.jsonl 2> $R/b2b_16k.err; echo "back to back 16K: exit $?"
timeout 120 .dev/gpu_timing spread --seq 8192 --rounds 2 --reps 30 > $R/alone_8k.jsonl 2> $R/alone_8k.err; echo "alone 8K: exit $?"
for i in 1 2 3; do
  timeout 60 .dev/gpu_timing attention --seqs 8192 --head-dims 128 --json $R/mha_$i.jsonl > /dev/null 2>$R/mha_$i.err
done
python3 - $R <<'PY'
import json, sys, glob
R = sys.argv[1]
for f in ['b2b_8k', 'b2b_16k', 'alone_8k']:
    for r in map(json.loads, open(f'{R}/{f}.jsonl')):
        n = r['seq']; flops = 2.5 * 4 * n * n * 32 * 128 / 2
        rates = [flops / (t * 1e-3) / 1e12 for t in r['bwd_ms']]
        print(f"{f} round {r['round']}: bwd TFLOP/s " + ' '.join('%.0f' % x for x in rates))
xs = [json.loads(open(p).readline()) for p in sorted(glob.glob(f'{R}/mha_*.jsonl'))]
print('mha 8K processes: bwd ' + ' '.join('%.0f' % x['bwd_tflops'] for x in xs))
PY
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call 4 (nvidia-h200), carry [".dev"]. Build: v34 = .dev/ (call 2's; main 8b058e2).
# Question: the d128 backward at 8K spreads from 550 to 615 TFLOP/s between runs of one build
# (calls 1-3: v31 585, 579, 561, 558; v34 552, 615, 612), wider than at 32K (583-590). Is a slow
# run a property of the process, of the allocation (the tensors' addresses) or of the moment?
# Prediction, written before the call: the allocation: within a round (same tensors) the reps
# agree within 1%, between rounds (fresh tensors at other addresses) they differ by up to 10%;
# the SM clock holds 1980 MHz at 8K (short-bwd call 1), so not the moment.
# 1. gpu_timing spread (MHA d128, causal, each backward timed alone): 8K, 8 rounds of 8 reps;
#    16K, 4 rounds of 6; nvidia-smi sampling the SM clock and power every 50 ms throughout;
# 2. gpu_timing attention at 8K in 4 fresh processes (MHA), then 4 more at 8K GQA 32/8.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt
.dev/gpu_timing attention --seqs 4096 --head-dims 128 > /dev/null 2>&1  # compile, warm
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 50 > $R/clocks.csv &
SMI=$!
echo "spread start $(date +%T.%N)" > $R/marks.txt
timeout 120 .dev/gpu_timing spread --seq 8192 --rounds 8 --reps 8 > $R/spread_8k.jsonl 2> $R/spread_8k.err; echo "spread 8K: exit $?"
echo "spread 16K start $(date +%T.%N)" >> $R/marks.txt
timeout 120 .dev/gpu_timing spread --seq 16384 --rounds 4 --reps 6 > $R/spread_16k.jsonl 2> $R/spread_16k.err; echo "spread 16K: exit $?"
echo "processes start $(date +%T.%N)" >> $R/marks.txt
for i in 1 2 3 4; do
  timeout 60 .dev/gpu_timing attention --seqs 8192 --head-dims 128 --json $R/mha_$i.jsonl > /dev/null 2>$R/mha_$i.err
done
for i in 1 2 3 4; do
  timeout 60 .dev/gpu_timing attention --seqs 8192 --head-dims 128 --kv-heads 8 --json $R/gqa_$i.jsonl > /dev/null 2>$R/gqa_$i.err
done
echo "end $(date +%T.%N)" >> $R/marks.txt
kill $SMI
python3 - $R <<'PY'
import json, sys, glob, statistics as st
R = sys.argv[1]
for f in ['spread_8k', 'spread_16k']:
    for r in map(json.loads, open(f'{R}/{f}.jsonl')):
        n = r['seq']; flops = 2.5 * 4 * n * n * 32 * 128 / 2
        rates = [flops / (t * 1e-3) / 1e12 for t in r['bwd_ms']]
        print(f"{f} round {r['round']}: bwd TFLOP/s " + ' '.join('%.0f' % x for x in rates))
for kind in ['mha', 'gqa']:
    xs = [json.loads(open(p).readline()) for p in sorted(glob.glob(f'{R}/{kind}_*.jsonl'))]
    print(kind, '8K processes: bwd ' + ' '.join('%.0f' % x['bwd_tflops'] for x in xs) + '; fwd ' + ' '.join('%.0f' % x['fwd_tflops'] for x in xs))
rows = [l.split(', ') for l in open(f'{R}/clocks.csv').read().splitlines()[1:]]
num = lambda x: float(x.split()[0])
busy = [(num(r[1]), num(r[2])) for r in rows if len(r) > 2 and num(r[2]) > 200]  # samples under load
clk = [c for c, _ in busy]; pw = [p for _, p in busy]
print('under load (%d samples over 200 W): SM clock MHz min %.0f, median %.0f; power W median %.0f, max %.0f' % (len(busy), min(clk), st.median(clk), st.median(pw), max(pw)))
PY
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

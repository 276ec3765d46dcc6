#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: .dev/ of main with the head-by-head CTA order
# (fwd/bwd-key-major on, bwd-pairs off: call 1's outcome), build_gpu_tests.sh.
# Issue 18's table in one run, each length ours then SDPA (FlashAttention-2 and cuDNN):
#   mha/: causal bf16, batch 1, 32 heads, d128, 4K-256K;   gqa/: the same with 8 KV heads;
#   hd/:  head dims 64-256 at 8K (MHA).
# Then llama2-7b's step at 16K (remat), recorded 2.060/2.066 s and 48.07 GiB before.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R/mha $R/gqa $R/hd
SEQS=4096,8192,16384,32768,65536,131072,262144
ours() { timeout $1 .dev/distflash bench attention --device cuda "${@:2}"; }
ours 100 --seqs $SEQS --head-dims 128 --json $R/mha/ours.jsonl > $R/mha/ours.log 2>&1; echo "mha ours: exit $?"
timeout 170 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --json $R/mha/sdpa.jsonl > $R/mha/sdpa.log 2>&1; echo "mha sdpa: exit $?"
ours 90 --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/ours.jsonl > $R/gqa/ours.log 2>&1; echo "gqa ours: exit $?"
timeout 150 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --kv-heads 8 --json $R/gqa/sdpa.jsonl > $R/gqa/sdpa.log 2>&1; echo "gqa sdpa: exit $?"
ours 40 --seqs 8192 --head-dims 64,80,96,128,192,256 --json $R/hd/ours.jsonl > $R/hd/ours.log 2>&1; echo "hd ours: exit $?"
timeout 40 python3 bench/peers/sdpa_bench.py --seqs 8192 --head-dims 64,80,96,128,192,256 --json $R/hd/sdpa.jsonl > $R/hd/sdpa.log 2>&1; echo "hd sdpa: exit $?"
for d in mha gqa hd; do .dev/distflash bench report --results $R/$d > $R/$d/RESULTS.md 2>&1; echo "== $d"; grep "^| [0-9]" $R/$d/RESULTS.md; done
timeout 70 .dev/distflash bench train --device cuda --preset llama2-7b --json --warmup 1 --repeats 2 --seq-len 16384 --checkpoint remat > $R/train16k.json 2> $R/train16k.err
echo "train 16K remat: exit $? $(grep -o '"step_secs":[0-9.]*\|"peak_memory_gib":[0-9.]*' $R/train16k.json | paste -sd' ')"
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

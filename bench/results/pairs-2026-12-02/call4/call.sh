#!/usr/bin/env bash
# Device call (nvidia-h200), carry [".dev"]: the same .dev/ as call 2 (main 8653fd5).
# 1. The distributed schedules' blocks beside the whole sequence, as in
#    results/binding-blocks-2026-12-02/call2 (same command): the 32768² off-diagonal block ran
#    its backward at 340 TFLOP/s there against 418 for the diagonal one.
# 2. The masked module on the new order: 128K, 16 documents of 8192 and a 4096-token window
#    (results/final-verify-2026-12-02/call2: 74.8 and 80.3 ms forward+backward).
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
B=".dev/distflash bench attention --device cuda --head-dims 128 --heads 32"
timeout 150 $B --seqs 32768,131072 --blocks 4 --json $OUT/blocks4.jsonl > /dev/null 2>&1; echo "blocks 4: exit $?"
timeout 150 $B --seqs 131072 --blocks 8 --json $OUT/blocks8.jsonl > /dev/null 2>&1; echo "blocks 8: exit $?"
timeout 60 $B --seqs 131072 --doc-lens $(python3 -c "print(','.join(['8192']*16))") --json $OUT/docs.jsonl > /dev/null 2>&1; echo "docs: exit $?"
timeout 60 $B --seqs 131072 --window 4096 --json $OUT/window.jsonl > /dev/null 2>&1; echo "window: exit $?"
python3 - $OUT/*.jsonl <<'PY'
import json, sys
for f in sys.argv[1:]:
    for r in map(json.loads, open(f)):
        print(f.split('/')[-1], r.get("block", "whole"), r["seq"], r.get("chunk", ""), r.get("mask", ""),
              "fwd %.0f bwd %.0f fwd+bwd %.0f TFLOP/s, %.1f ms" % (r["fwd_tflops"], r["bwd_tflops"], r["fwdbwd_tflops"], r["fwd_ms"] + r["bwd_ms"]),
              "over whole %.3f" % r["fwdbwd_over_whole"] if "fwdbwd_over_whole" in r else "")
PY

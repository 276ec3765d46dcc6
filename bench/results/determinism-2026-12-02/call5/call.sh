#!/usr/bin/env bash
# Device call 5 (nvidia-h200), carry [".dev"]: .dev/ = the final kernels (call 3's, with the
# turn helpers renamed wait_add_turn/pass_add_turn; call 4's one-tile-late turn not kept).
# 1. gpu_attention deterministic, then default;
# 2. issue 18's MHA table again after the reorder: `bench attention` then SDPA (FA2, cuDNN),
#    causal bf16, batch 1, 32 heads, d128, 4K-256K, as results/pairs-2026-12-02/call2.
set -u
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=/tmp/distflash-cache
R=$OUT/runs; mkdir -p $R/mha
for v in det default; do
  case $v in default) T="";; det) T=deterministic=true;; esac
  DISTFLASH_TUNING=$T LOG=$R/gpu_attention_$v.log TESTS=gpu_attention TIMEOUT=300 bash bench/peers/gpu_tests.sh > /dev/null 2>&1; echo "gpu_attention $v: exit $?"
  grep -h "passed: worst\|test result\|FAIL\|panicked\|Error\|error:" $R/gpu_attention_$v.log | tail -n 8
  grep -h "three runs" $R/gpu_attention_$v.log | grep -c "deterministic=true: three runs the same bits" | sed 's/^/  deterministic cases with the same bits: /'
done
SEQS=4096,8192,16384,32768,65536,131072,262144
timeout 110 .dev/distflash bench attention --device cuda --seqs $SEQS --head-dims 128 --json $R/mha/ours.jsonl > $R/mha/ours.log 2>&1; echo "mha ours: exit $?"
timeout 180 python3 bench/peers/sdpa_bench.py --seqs $SEQS --head-dims 128 --json $R/mha/sdpa.jsonl > $R/mha/sdpa.log 2>&1; echo "mha sdpa: exit $?"
.dev/distflash bench report --results $R/mha > $R/mha/RESULTS.md 2>&1; grep "^| [0-9]" $R/mha/RESULTS.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R

#!/usr/bin/env bash
# Device call (nvidia-h200): is the 128K causal slowdown the binary? .dev/old/distflash of
# 03eeefb (842 ms backward in calls before) and .dev/distflash of 7645289 (merged main),
# alternated; then the window and documents with the merged main (the mask arguments the
# previous call's script forgot), then mask_bench.sh beside FlexAttention. Each line also
# records the SM clock, temperature and power after the run. .dev/distflash rebuilt at da168cb
# (no source change since 7645289 but a comment). carry [".dev"]. Run 2026-12-02, ninth session.
set -u
export DISTFLASH_CACHE_DIR=/tmp/distflash-cache
DOCS=$(python3 -c 'print(",".join(["8192"] * 16))')
run() {  # tag, binary, mask arguments
  local tag=$1 bin=$2; shift 2
  $bin bench attention --device cuda --seqs 131072 --head-dims 128 --heads 32 "$@" --json $OUT/t_$tag.jsonl > /dev/null 2>&1
  echo "$tag $(nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader) $(grep -o '"fwd_ms":[0-9.]*\|"bwd_ms":[0-9.]*' $OUT/t_$tag.jsonl | paste -sd' ')"
}
{
run causal_old1 .dev/old/distflash
run causal_new1 .dev/distflash
run window_new .dev/distflash --window 4096
run docs_new .dev/distflash --doc-lens $DOCS
run causal_old2 .dev/old/distflash
run causal_new2 .dev/distflash
run causal_new3 .dev/distflash
run causal_old3 .dev/old/distflash
} | tee $OUT/timing.txt
cat $OUT/t_*.jsonl > $OUT/timing.jsonl && rm $OUT/t_*.jsonl
# The issue's criterion in one run: ours (causal, documents, window) beside FlexAttention.
export PATH=/opt/torch/.venv/bin:$PATH
MASK_PART=timing BIN=.dev/distflash timeout 260 bash bench/peers/mask_bench.sh > $OUT/mask_timing.out 2>&1
echo "mask timing exit $?"; grep -o '"mask": "[^"]*"\|"fwdbwd_over_ideal": [0-9.]*\|"flex_fwdbwd_ms": [0-9.]*' $OUT/mask_bench.json | paste -sd' '

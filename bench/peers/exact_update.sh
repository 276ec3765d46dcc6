#!/usr/bin/env bash
# One device call: the exact update (AdamW through an f32 master of the 16-bit weights) on a GPU,
# beside the build before it (BASE, default .dev/base/distflash; skipped if absent). Writes to $OUT:
#   gpu_tests.log   tests/gpu_ops.rs (every op against the CPU; 1000 AdamW steps at lr 2e-5
#                   against f64, with a master and in place; offloaded state the same bits) and
#                   tests/gpu_model_attention.rs, by gpu_tests.sh
#   resume.jsonl    a tiny model (head dim 64) trained 6 steps straight, and 3 steps saved then resumed to 6:
#                   the resumed steps' losses must be the same bits (the checkpoint holds the
#                   masters, so a resumed run continues the exact trajectory)
#   step_<build>.json   `bench train --device cuda --optimizer` (the step as `train` runs it,
#                   AdamW included) of llama2-7b's first LAYERS layers (default 16: an H100's
#                   80 GB) at SEQ tokens (default 32768), remat: time, peak, estimate, per build
#   exact_update.log    the commands and their exit codes
# PARTS (default "tests resume step") picks the sections.
# Run from the repository root with the binaries built here by build_gpu_tests.sh:
#   mkdir -p .dev/base && cp <old distflash> .dev/base/   # optional: the build to compare with
#   bash bench/peers/build_gpu_tests.sh                   # then a device call, carry [".dev"]:
#   bash bench/peers/exact_update.sh
set -u
BIN_DIR=${BIN_DIR:-.dev}
BASE=${BASE:-.dev/base/distflash}
LAYERS=${LAYERS:-16}
SEQ=${SEQ:-32768}
PARTS=" ${PARTS:-tests resume step} "
PEERS=$(dirname "$0")
LOG=$OUT/exact_update.log
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
status=0
run() {
  echo "+ $*" >> "$LOG"
  "$@"
  local rc=$?
  echo "exit $rc" >> "$LOG"
  [ $rc -eq 0 ] || status=1
}
if [[ $PARTS == *" tests "* ]]; then
  BIN_DIR=$BIN_DIR TESTS="gpu_ops gpu_model_attention" TIMEOUT=200 bash "$PEERS/gpu_tests.sh" || status=1
fi

if [[ $PARTS == *" resume "* ]]; then
SAVE=$(mktemp -d)
# The tiny preset with head dim 64, which the CUDA attention kernels take.
cat > "$SAVE/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 256, "hidden_size": 256, "intermediate_size": 688,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
JSON
TINY=(train --device cuda --config "$SAVE/config.json" --seq-len 256 --json)
run "$BIN_DIR/distflash" "${TINY[@]}" --steps 6 > "$OUT/straight.jsonl" 2>> "$LOG"
run "$BIN_DIR/distflash" "${TINY[@]}" --steps 3 --save-dir "$SAVE/s" > /dev/null 2>> "$LOG"
run "$BIN_DIR/distflash" "${TINY[@]}" --steps 6 --resume "$SAVE/s" > "$OUT/resumed.jsonl" 2>> "$LOG"
python3 - "$OUT" <<'EOF' || status=1
import json, sys
out = sys.argv[1]
def losses(name):
    rows = [json.loads(l) for l in open(f"{out}/{name}") if l.startswith('{"step"')]
    return {r["step"]: r["loss"] for r in rows}
straight, resumed = losses("straight.jsonl"), losses("resumed.jsonl")
same = all(straight[s] == resumed[s] for s in (4, 5, 6))
line = {"straight": straight, "resumed": resumed, "resumed_steps_same_bits": same}
open(f"{out}/resume.jsonl", "w").write(json.dumps(line) + "\n")
print("resume:", "same bits" if same else "DIFFERENT", line)
sys.exit(0 if same else 1)
EOF
fi

if [[ $PARTS == *" step "* ]]; then
STEP=(bench train --device cuda --preset llama2-7b --layers "$LAYERS" --seq-len "$SEQ" --checkpoint remat --optimizer --json)
for build in new base; do
  bin=$BIN_DIR/distflash
  [ $build = base ] && bin=$BASE
  [ -x "$bin" ] || continue
  run timeout 300 "$bin" "${STEP[@]}" > "$OUT/step_$build.json" 2>> "$LOG"
done
fi
exit $status

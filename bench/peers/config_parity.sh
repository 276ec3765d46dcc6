#!/usr/bin/env bash
# One device call (nvidia-h200): the configs of issue 20 against transformers, and the new GPU
# ops against the CPU. Writes to $OUT:
#   gpu_tests.log       tests/gpu_ops.rs (bias_add / bias_backward, rope with Llama 3's and
#                       YaRN's tables, the tiny model as LLaMA, as Qwen2, with LLaMA's
#                       attention_bias and as Qwen3), run by gpu_tests.sh
#   parity_<case>.log, hf_parity*.json
#                       bench/peers/hf_parity.py for every case below, on the CPU in f32 against
#                       transformers' float64 (within 1e-4) and, where the GPU runs the case, in
#                       bf16 (within 2x transformers' own bf16 error); Mistral's window on both
#                       (the CUDA kernels take its mask).
# Run from the repository root with the binaries built here by build_gpu_tests.sh:
#   bash bench/peers/build_gpu_tests.sh
#   BIN_DIR=.dev bash bench/peers/config_parity.sh          (device call, carry [".dev"])
set -u
BIN_DIR=${BIN_DIR:-.dev}
PEERS=$(dirname "$0")
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
# CASES="qwen2:cpu yarn:cuda ..." runs only those (name:device, names as below).
CASES=${CASES:-}
status=0
[ -z "$CASES" ] && { BIN_DIR=$BIN_DIR TESTS="gpu_ops" bash "$PEERS/gpu_tests.sh" || status=1; }
run() {  # name, device, hf_parity arguments
  local name=$1 device=$2
  shift 2
  [ -n "$CASES" ] && [[ " $CASES " != *" $name:$device "* ]] && return
  local dir
  dir=$(mktemp -d)
  if timeout "${CASE_TIMEOUT:-120}" $PY "$PEERS/hf_parity.py" --bin "$BIN_DIR/distflash" --out "$dir" --device "$device" "$@" \
    > "$OUT/parity_${name}_$device.log" 2>&1; then
    echo "$name ($device) passed"
  else
    echo "$name ($device) FAILED (see parity_${name}_$device.log)"
    status=1
  fi
  cp "$dir"/hf_parity*.json "$OUT/" 2>/dev/null
}
for device in cpu cuda; do
  run qwen2 "$device" --model-type qwen2
  run llama_bias "$device" --model-type llama --attention-bias
  run yarn "$device" --rope-scaling yarn
  run llama3 "$device" --rope-scaling llama3
  run linear "$device" --rope-scaling linear
  run dynamic "$device" --rope-scaling dynamic
  run qwen2_yarn "$device" --model-type qwen2 --rope-scaling yarn
  run mistral "$device" --model-type mistral
  run qwen3 "$device" --model-type qwen3
  run qwen3_tied_bias "$device" --model-type qwen3 --tie-word-embeddings --attention-bias
done
for device in cpu cuda; do
  run mistral_window16 "$device" --model-type mistral --sliding-window 16
done
tail -n 2 "$OUT"/parity_*.log
exit $status

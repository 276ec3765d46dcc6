#!/usr/bin/env bash
# The GPU checks of start-up and of sharding at 7B, in one device call (issue 16):
#   1. tests/gpu_ops.rs (bf16 and fp16): among them, weights drawn on the GPU are the CPU's to
#      the bit (the counter-based initialisation), which is what lets any shard draw its piece
#   2. time to first step of `train --device cuda` for llama2-7b and for a Llama-3-8B-shaped
#      config.json with AdamW at 16K: once with an empty kernel cache (a machine's first run),
#      once warm; `startup_secs` of the summary, beside the wall time of the command
#   3. `bench train` llama2-7b 16K remat: 1 worker, 2 virtual workers --shard none, and 2 virtual
#      workers --shard full, one after another in this call
#   4. a Llama-3-8B-shaped checkpoint written by transformers (random, bf16): the time to first
#      step of `train --init-from` it, on 1 worker and on 2 virtual workers under --shard full
#      (each reads only its pieces)
#   5. the short tiny-shape training of shard_rope_checks.sh with 2 and 3 virtual workers under
#      every --shard against --shard none (compare_losses.py)
# Run from the repository root on the GPU machine with the binaries in .dev/:
#   bash bench/peers/build_gpu_tests.sh   (here)   then   OUT=... bash bench/peers/startup_checks.sh
# SECTIONS="bench init" runs only those (of: gpu_ops startup bench init shard).
set -u
BIN=${BIN_DIR:-.dev}/distflash
PEERS=$(dirname "$0")
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache-startup} PYTHONUNBUFFERED=1
SECTIONS=${SECTIONS:-gpu_ops startup bench init shard}
rm -rf "$DISTFLASH_CACHE_DIR"
WORK=$(mktemp -d)
LOG=$OUT/startup.log
: > "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$LOG"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); sections: $SECTIONS" >> "$LOG"
wanted() { [[ " $SECTIONS " == *" $1 "* ]]; }
# Runs a command, logging it, its exit status and its wall time (seconds).
timed() {
  local t0 t1 rc
  t0=$(date +%s%N)
  "$@"
  rc=$?
  t1=$(date +%s%N)
  echo "exit $rc, wall $(( (t1 - t0) / 1000000 )) ms: ${*:2}" >> "$LOG"
}

if wanted gpu_ops; then
DISTFLASH_GPU_TESTS=1 timeout 300 "${BIN_DIR:-.dev}/gpu_ops" --include-ignored --test-threads 1 --nocapture \
  > "$OUT/gpu_ops.log" 2>&1
echo "gpu_ops: exit $?" | tee -a "$LOG"
grep -E "random|test result|FAIL" "$OUT/gpu_ops.log" >> "$LOG"
fi

# Llama-3-8B's shape (meta-llama/Meta-Llama-3-8B's config.json), random weights.
mkdir -p "$WORK/llama3-8b"
cat > "$WORK/llama3-8b/config.json" <<'JSON'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
 "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
 "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16"}
JSON
if wanted startup; then
for model in "llama2-7b --preset llama2-7b" "llama3-8b --config $WORK/llama3-8b/config.json"; do
  set -- $model
  name=$1; shift
  for cache in cold warm; do
    echo "=== $cache kernel cache" >> "$LOG"
    timed timeout 300 "$BIN" train --device cuda "$@" --seq-len 16384 --steps 2 --lr 1e-5 --json \
      > "$WORK/train_${name}_$cache.jsonl" 2>> "$LOG"
    cat "$WORK/train_${name}_$cache.jsonl" >> "$LOG"
  done
done
fi

if wanted bench; then
BENCH="bench train --device cuda --preset llama2-7b --seq-len 16384 --checkpoint remat --json ${BENCH_ARGS:-}"
for run in ${BENCH_RUNS:-"1:none" "2:none" "2:full" "1:none"}; do
  set -- ${run/:/ }
  timed timeout "${BENCH_TIMEOUT:-300}" "$BIN" $BENCH --workers "$1" --shard "$2" >> "$LOG" 2>&1
done
fi

if wanted init; then
# transformers writes the checkpoint (random weights, bf16, on the GPU, no download).
timed timeout 300 $PY - "$WORK/llama3-8b" <<'PYEOF' >> "$LOG" 2>&1
import sys, torch, transformers
out = sys.argv[1]
cfg = transformers.AutoConfig.from_pretrained(out)
with torch.device("cuda"):
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained(out)
print("transformers", transformers.__version__, "wrote", out)
PYEOF
ls -la "$WORK/llama3-8b" >> "$LOG"
for run in "1 none" "2 full"; do
  set -- $run
  echo "=== init-from, workers $1, shard $2" >> "$LOG"
  timed timeout "${INIT_TIMEOUT:-300}" "$BIN" train --device cuda --init-from "$WORK/llama3-8b" --seq-len 16384 \
    --batch 1 --steps 2 --lr 1e-5 --workers "$1" --shard "$2" --json >> "$LOG" 2>&1
done
rm -rf "$WORK/llama3-8b"
fi

if wanted shard; then
timeout 200 $PY "$PEERS/hf_parity.py" --bin "$BIN" --out "$WORK/g" --device cuda > "$WORK/g.log" 2>&1
TRAIN="train --device cuda --config $WORK/g/hf-model/config.json --seq-len 512 --batch 4 --steps 20 --lr 3e-3 --json"
for run in "2 none" "2 full" "3 full" "2 optimizer" "3 grads"; do
  set -- $run
  timeout 120 "$BIN" $TRAIN --workers "$1" --shard "$2" > "$WORK/train_$1_$2.jsonl" 2>> "$LOG"
  echo "train (tiny shape) --workers $1 --shard $2: exit $?" | tee -a "$LOG"
done
python3 "$PEERS/compare_losses.py" "$WORK/train_2_none.jsonl" "$WORK"/train_2_full.jsonl \
  "$WORK/train_3_full.jsonl" "$WORK/train_2_optimizer.jsonl" "$WORK/train_3_grads.jsonl" 2>&1 \
  | tee -a "$LOG" | tail -n 7
fi

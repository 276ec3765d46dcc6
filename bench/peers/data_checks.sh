#!/usr/bin/env bash
# One device call (nvidia-h200): training on tokenized text on the GPU, and the 7B's start-up.
#   1. a BPE tokenizer (Python `tokenizers`, vocabulary 256) trained on README.md; its
#      paragraphs as JSON lines, every fifth held out; the small GQA model (head dim 64)
#      trained 30 steps on one GPU worker and on 2 virtual workers (--shard full) with
#      --tokenizer, --eval-data, --decay cosine: the training and held-out losses fall
#   2. llama2-7b: `train --device cuda --lr 1e-5 --seq-len 4096 --steps 1`: its start-up time
#      (`startup_secs`: random weights, the device, AdamW's state) and first step
# Writes $OUT/data_checks.log (everything) and $OUT/data_checks.jsonl (the runs' JSON lines).
# Run from the repository root with .dev/ built by bench/peers/build_gpu_tests.sh.
set -u
BIN=${BIN_DIR:-.dev}/distflash
PY=python3; [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache} PYTHONUNBUFFERED=1
WORK=$(mktemp -d)
LOG=$OUT/data_checks.log
$PY - "$WORK" <<'PY' >> "$LOG" 2>&1
import sys
from pathlib import Path
sys.path.insert(0, "bench/peers")
from finetune_check import tokenizer_and_data
vocab, docs = tokenizer_and_data(Path(sys.argv[1]), Path("README.md").read_text(), 256)
print("tokenizer vocabulary", vocab, "documents", docs)
PY
cat > "$WORK/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
 "hidden_size": 256, "intermediate_size": 448, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5,
 "rope_theta": 500000.0, "tie_word_embeddings": false, "max_position_embeddings": 4096}
JSON
TRAIN="train --device cuda --config $WORK/config.json --tokenizer $WORK/tokenizer.json --data $WORK/corpus.jsonl --eval-data $WORK/held.jsonl --eval-every 10 --eval-sequences 2 --seq-len 256 --batch 4 --steps 30 --lr 3e-3 --warmup 5 --decay cosine --min-lr 3e-4 --json"
for workers in 1 2; do
  echo "=== text, $workers GPU worker(s)" | tee -a "$LOG"
  timeout 150 "$BIN" $TRAIN --workers "$workers" --shard full > "$WORK/text_$workers.jsonl" 2>> "$LOG"
  echo "exit $?" | tee -a "$LOG"
  cat "$WORK/text_$workers.jsonl" >> "$OUT/data_checks.jsonl"
  grep -o '"step":\(1\|10\|20\|30\),"loss":[0-9.]*\|"eval_loss":[0-9.]*' "$WORK/text_$workers.jsonl" | tr '\n' ' '; echo
  tail -n 1 "$WORK/text_$workers.jsonl" | grep -o '"startup_secs":[0-9.]*\|"eval_loss_first":[0-9.]*\|"eval_loss_last":[0-9.]*' | tr '\n' ' '; echo
done
echo "=== llama2-7b start-up" | tee -a "$LOG"
timeout 330 "$BIN" train --device cuda --preset llama2-7b --lr 1e-5 --seq-len 4096 --batch 1 --steps 1 --json \
  > "$WORK/7b.jsonl" 2>> "$LOG"
echo "exit $?" | tee -a "$LOG"
cat "$WORK/7b.jsonl" >> "$OUT/data_checks.jsonl"
tail -n 1 "$WORK/7b.jsonl" | grep -o '"startup_secs":[0-9.]*\|"wall_secs":[0-9.]*' | tr '\n' ' '; echo

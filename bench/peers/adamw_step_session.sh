#!/usr/bin/env bash
# One device call: the whole LLaMA-7B training step with AdamW, batch 1, on three stacks at the
# same lengths and layer count (issue 49's measurement):
#   distflash  `train --device cuda` with its defaults (remat, `--whole-layers auto`,
#              `--offload auto`: the checkpoints wait in host memory where that leaves room for
#              more whole layers, 0.8–1.5% faster at 16K–64K on an H100,
#              bench/results/low-half-master-2026-12-06, or where the step fits only so),
#              median of its steps after the first;
#   transformers  bench/peers/hf_train_bench.py (gradient checkpointing, SDPA, fused AdamW);
#   transformers + Liger  the same with --liger (liger-kernel carried as a wheel in .dev/wheels).
# Then distflash's per-op profile (`bench train --profile`, no optimizer) at PROFILE_SEQS and the
# bf16 GEMM rate of the step's linear shapes through torch, the rate its ideal is counted at.
# Run from the repository root, with carry [".dev"] (the binary built here into .dev/distflash):
#   SEQS="16384 32768 65536 131072" STACKS="ours hf" bash bench/peers/adamw_step_session.sh
# (LAYERS: all 32 on a card of over 120 GB, else 16; STACKS: any of ours hf liger profile gemm;
# OFFLOAD: distflash's --offload, by default auto; `all` for the longest lengths, where AdamW's
# moments wait in host memory too; CHECKPOINT: distflash's --checkpoint, by default remat, `layer`
# for the longest lengths, whose checkpoints then take half the host memory; STEPS=1 times each
# stack's first step alone, for lengths where two steps would not fit the call.)
# The longest lengths on one H200 (128 GiB host), one step each:
#   STACKS=ours SEQS=294912 CHECKPOINT=layer OFFLOAD=activations STEPS=1 RUN_TIMEOUT=300 bash bench/peers/adamw_step_session.sh
#   STACKS=liger SEQS=229376 STEPS=1 HF_TIMEOUT=220 bash bench/peers/adamw_step_session.sh
# Writes ours.jsonl, hf.jsonl, profile.log, gemm.jsonl and session.log to $OUT.
set -u
BIN=${BIN:-.dev/distflash}
# The whole model where the card holds it (an H200), its first 16 layers on an 80 GB H100.
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
LAYERS=${LAYERS:-$([ "${total:-0}" -gt 120000 ] && echo 32 || echo 16)}
SEQS=${SEQS:-16384 32768 65536 131072}
PROFILE_SEQS=${PROFILE_SEQS:-65536 131072}
STEPS=${STEPS:-3}
STACKS=${STACKS:-ours hf liger profile gemm}
OFFLOAD=${OFFLOAD:-auto}
CHECKPOINT=${CHECKPOINT:-remat}
PEERS=$(dirname "$0")
LOG="$OUT/session.log"
export PATH=/opt/torch/.venv/bin:$PATH DISTFLASH_CACHE_DIR=${DISTFLASH_CACHE_DIR:-/tmp/distflash-cache}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv >> "$LOG" 2>&1
# The preset's shape with LAYERS decoder layers, as a Hugging Face config (train has no --layers).
CFG=/tmp/llama2-7b-$LAYERS.json
cat > "$CFG" <<JSON
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 11008, "num_hidden_layers": $LAYERS, "num_attention_heads": 32,
 "num_key_value_heads": 32, "vocab_size": 32000, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
 "max_position_embeddings": 4096, "tie_word_embeddings": false, "hidden_act": "silu"}
JSON
has() { case " $STACKS " in *" $1 "*) return 0;; esac; return 1; }
if has ours; then
  for n in $SEQS; do
    echo "=== distflash seq $n layers $LAYERS checkpoint $CHECKPOINT offload $OFFLOAD" | tee -a "$LOG"
    began=$(date +%s.%N)
    timeout "${RUN_TIMEOUT:-300}" "$BIN" train --device cuda --config "$CFG" --seq-len "$n" --batch 1 \
        --steps "$STEPS" --lr 1e-5 --warmup 1 --checkpoint "$CHECKPOINT" --offload "$OFFLOAD" --json \
        > /tmp/ours.jsonl 2>> "$LOG"
    echo "exit $? in $(python3 -c "import time;print(round(time.time()-$began,1))") s" | tee -a "$LOG"
    sed "s/^{/{\"seq\":$n,\"layers\":$LAYERS,\"offload_asked\":\"$OFFLOAD\",/" /tmp/ours.jsonl >> "$OUT/ours.jsonl"
  done
fi
hf_run() {
  echo "=== transformers $* seqs $SEQS layers $LAYERS" | tee -a "$LOG"
  timeout "${HF_TIMEOUT:-400}" python3 "$PEERS/hf_train_bench.py" --seq "$(echo $SEQS | tr ' ' ',')" \
    --layers "$LAYERS" --optimizer adamw --warmup $((STEPS > 1)) --repeats $((STEPS > 1 ? STEPS - 1 : 1)) "$@" \
    --out "$OUT/hf.jsonl" >> "$LOG" 2>&1 || echo "transformers $* failed: $(tail -n 3 "$LOG")"
}
has hf && hf_run
if has liger; then
  python3 -m pip install --quiet --no-deps --no-index --target /tmp/liger .dev/wheels/liger_kernel-*.whl >> "$LOG" 2>&1
  PYTHONPATH=/tmp/liger hf_run --liger
fi
if has profile; then
  for n in $PROFILE_SEQS; do
    echo "=== distflash profile seq $n layers $LAYERS" | tee -a "$LOG"
    timeout 300 "$BIN" bench train --device cuda --layers "$LAYERS" --seq-len "$n" --checkpoint remat \
      --warmup 1 --repeats 1 --profile >> "$OUT/profile.log" 2>> "$LOG" || echo "profile $n failed" | tee -a "$LOG"
  done
fi
if has gemm; then
  python3 - "$SEQS" >> "$OUT/gemm.jsonl" 2>> "$LOG" <<'PY'
import json, sys, torch
# The step's linear shapes (tokens x 4096 times 4096 x {4096, 11008, 32000}) at each length,
# timed as the median of 10 after 3 warm-ups, on random data.
for n in [int(s) for s in sys.argv[1].split()]:
    for k, m in [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 32000)]:
        a = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, m, device="cuda", dtype=torch.bfloat16)
        times = []
        for i in range(13):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); a @ b; e.record(); torch.cuda.synchronize()
            if i >= 3: times.append(s.elapsed_time(e) / 1e3)
        t = sorted(times)[len(times) // 2]
        print(json.dumps({"tokens": n, "k": k, "m": m, "secs": t, "tflops": 2 * n * k * m / t / 1e12}))
        del a, b
PY
fi
echo "=== done" | tee -a "$LOG"

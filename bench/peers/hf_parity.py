#!/usr/bin/env python3
"""Hugging Face parity: our loss and every parameter gradient against transformers' own.

Builds a small random LlamaForCausalLM (GQA, untied embeddings, rope theta 500000, norm gains
away from 1), saves it (config.json + model.safetensors, float32), computes the mean
next-token cross-entropy of one random sequence and all parameter gradients in float64 with
transformers, then runs `distflash grads --init-from DIR` on the same tokens (several worker
counts and checkpoint policies) and reports, per tensor, max |ours - theirs| / max |theirs|.

    python3 bench/peers/hf_parity.py --bin target/release/distflash --out OUTDIR

Needs torch, transformers and safetensors (run on the CPU; no GPU used); f32 results must be
within 1e-4 of the float64 reference.

    python3 bench/peers/hf_parity.py --bin .dev/distflash --out OUTDIR --device cuda

`--rope-scaling linear|llama3|yarn|dynamic` builds the model with that rotary scaling (Llama
3.1's parameters, or a factor of 4), so the check covers the rescaled frequencies too. YaRN
(factor 4 over an original context of 4096, its default attention factor 0.1 ln 4 + 1 scaling
cos and sin) follows transformers 5's reading of `rope_parameters`. Dynamic NTK is built with
max_position_embeddings 16, shorter than the sequence, so transformers recomputes its
frequencies from the sequence's length, which distflash takes from the run.

`--model-type qwen2` builds a Qwen2ForCausalLM instead (q/k/v projection biases, random so they
matter, and their gradients compared like every other); `--model-type llama --attention-bias`
a LLaMA with LlamaConfig's attention_bias (q, k, v and o biases); `--model-type mistral` a
MistralForCausalLM (`--sliding-window W` sets its window; none: full causal attention);
`--model-type qwen3` a Qwen3ForCausalLM (q_norm and k_norm on every head, their gains random
like every norm's, and heads of twice hidden_size / heads, so the query width is twice the
hidden size, as in Qwen3-0.6B; `--attention-bias` gives it biases on q, k, v and o, as
Qwen3Config reads it). `--tie-word-embeddings` ties the output projection to the embedding (the
small Qwen3s do); its gradient is then the embedding's.

    python3 bench/peers/hf_parity.py --bin .dev/distflash --out OUTDIR --device cuda

runs distflash on the GPU in bf16 (one worker under every checkpoint policy on every layer, then
with the last layer whole above remat ones, then 2 and 3
virtual workers sharing the GPU) on a model with head dim
64 (the CUDA kernels' smallest) and a length that is not a multiple of 128, and compares with
transformers run in bf16 on the same weights: our error against the float64 reference must be
at most twice transformers' own bf16 error, loss (floored at 2^-9) and worst gradient alike.
"""
import argparse
import copy
import inspect
import json
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

TOLERANCE = 1e-4  # f32 results against a float64 reference


# The model's shape: tiny for the CPU's f32 check; head dim 64 for the GPU's kernels.
SHAPES = {
    "cpu": dict(vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                num_attention_heads=8,
                num_key_value_heads=2, head_dim=8),
    "cuda": dict(vocab_size=256, hidden_size=256, intermediate_size=448, num_hidden_layers=2,
                 num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64),
}


# Rotary scalings: Llama 3.1's own parameters (on the CPU's head dim 8 they put one frequency
# in each of its three regimes: kept, blended, interpolated), and position interpolation.
ROPE_SCALINGS = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}

# The context the model was trained for: 4096, except for dynamic NTK, which changes nothing
# within it.
MAX_POSITIONS = {"dynamic": 16}


# model_type: the config and model classes.
MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}

# Families whose configs read attention_bias (biases on q, k, v and o).
ATTENTION_BIAS = {"llama", "qwen3"}

# Families whose heads are wider than hidden_size / heads here: the head dim is doubled.
WIDE_HEADS = {"qwen3"}


def accepts(config_class, key):
    """Whether `config_class` takes `key` (transformers 5's configs are strict dataclasses)."""
    params = inspect.signature(config_class.__init__).parameters
    return key in params or key in getattr(config_class, "__dataclass_fields__", {})


def rope_arguments(config_class, scaling):
    """θ 500000 and `scaling` as this transformers takes them (5: `rope_parameters`)."""
    if accepts(config_class, "rope_parameters"):
        return {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}
                | (scaling or {})}
    return {"rope_theta": 500000.0, "rope_scaling": scaling}


def type_arguments(model_type, attention_bias, sliding_window):
    """The keys of each config class that set biases and windows."""
    if model_type == "llama":
        return {"attention_bias": attention_bias, "mlp_bias": False}
    if model_type == "qwen2":
        return {"use_sliding_window": False}
    if model_type == "qwen3":
        return {"attention_bias": attention_bias, "use_sliding_window": False}
    return {"sliding_window": sliding_window}


def head_dim(device, model_type):
    """The head dim of the model built: the shape's, doubled for the families in WIDE_HEADS."""
    return SHAPES[device]["head_dim"] * (2 if model_type in WIDE_HEADS else 1)


def build(out: Path, seed: int, device: str, scaling=None, model_type="llama",
          attention_bias=False, sliding_window=None, tied=False):
    torch.manual_seed(seed)
    config_class, model_class = MODELS[model_type]
    # Every shape has head_dim = hidden_size / heads, so a config class without the key (some
    # Qwen2Config versions) derives the same; Qwen3's heads are wider (WIDE_HEADS).
    shape = {k: v for k, v in SHAPES[device].items()
             if k != "head_dim" or accepts(config_class, k)}
    if "head_dim" in shape:
        shape["head_dim"] = head_dim(device, model_type)
    config = config_class(
        **shape,
        rms_norm_eps=1e-5,
        **rope_arguments(config_class, scaling),
        tie_word_embeddings=tied,
        **type_arguments(model_type, attention_bias, sliding_window),
        initializer_range=0.1,
        max_position_embeddings=MAX_POSITIONS.get((scaling or {}).get("rope_type"), 4096),
    )
    config._attn_implementation = "eager"
    model = model_class(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):  # zero at initialization: random so they matter
                p.copy_(0.2 * torch.randn_like(p))
            elif p.dim() == 1:  # norm gains: away from 1 so their gradients matter
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    model.save_pretrained(out, safe_serialization=True)
    if scaling is None:
        rotary = next(m for n, m in model.named_modules() if n.endswith("rotary_emb"))
        theta = 1.0 / rotary.inv_freq[1].item() ** (head_dim(device, model_type) / 2)
        assert abs(theta - 500000.0) / 500000.0 < 1e-3, f"rope theta not applied: {theta}"
    return model.to(torch.float64), config


def errors_against(grads, grads_ref):
    """Per tensor, max |ours - theirs| / max |theirs|."""
    out = {}
    for name, ref in grads_ref.items():
        diff = (grads[name].double().cpu() - ref).abs().max().item()
        out[name] = diff / max(ref.abs().max().item(), 1e-300)
    return out


def transformers_bf16(model, tokens, loss_ref, grads_ref):
    """transformers' own bf16 error against the float64 reference: the bar the GPU run meets."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    low = copy.deepcopy(model).to(device=device, dtype=torch.bfloat16)
    loss, grads = reference(low, tokens.to(device))
    errors = errors_against(grads, grads_ref)
    return abs(loss - loss_ref) / abs(loss_ref), max(errors.values())


def reference(model, tokens):
    model.zero_grad()
    logits = model(input_ids=tokens[None, :-1]).logits[0]
    loss = torch.nn.functional.cross_entropy(logits, tokens[1:])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return loss.item(), grads


def ours(binary, model_dir, tokens_file, out_file, workers, checkpoint, whole, device):
    cmd = [binary, "grads", "--init-from", str(model_dir), "--tokens", str(tokens_file),
           "--out", str(out_file), "--workers", str(workers), "--checkpoint", checkpoint,
           "--whole-layers", whole, "--device", device]
    if device == "cuda":
        cmd += ["--dtype", "bf16"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout), load_file(out_file)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the distflash binary")
    ap.add_argument("--out", required=True, help="directory for the model, tokens and report")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--seq-len", type=int, help="default 64 on the CPU, 300 on the GPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope-scaling", choices=sorted(ROPE_SCALINGS), default="none")
    ap.add_argument("--model-type", choices=sorted(MODELS), default="llama")
    ap.add_argument("--attention-bias", action="store_true",
                    help="attention_bias: q, k, v and o biases (llama and qwen3 only)")
    ap.add_argument("--sliding-window", type=int, help="Mistral's sliding_window (mistral only)")
    ap.add_argument("--tie-word-embeddings", action="store_true",
                    help="tie the output projection to the embedding")
    args = ap.parse_args()
    if args.attention_bias and args.model_type not in ATTENTION_BIAS:
        sys.exit("--attention-bias is read by LlamaConfig and Qwen3Config: use it with "
                 "--model-type llama or qwen3")
    if args.sliding_window is not None and args.model_type != "mistral":
        sys.exit("--sliding-window is Mistral's: use it with --model-type mistral")
    seq_len = args.seq_len or (64 if args.device == "cpu" else 300)
    out = Path(args.out)
    model_dir = out / "hf-model"
    model_dir.mkdir(parents=True, exist_ok=True)
    model, config = build(model_dir, args.seed, args.device, ROPE_SCALINGS[args.rope_scaling],
                          args.model_type, args.attention_bias, args.sliding_window,
                          args.tie_word_embeddings)
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, config.vocab_size, (seq_len + 1,), generator=g)
    tokens_file = out / "tokens.json"
    tokens_file.write_text(json.dumps(tokens.tolist()))
    loss_ref, grads_ref = reference(model, tokens)
    if args.device == "cpu":
        loss_tol = grad_tol = TOLERANCE
        cases = [(1, "remat", "0"), (4, "remat", "0"), (4, "layer", "0"), (3, "none", "0"),
                 (1, "layer", "1")]
        bar = {"tolerance": TOLERANCE}
    else:
        hf_loss_err, hf_grad_err = transformers_bf16(model, tokens, loss_ref, grads_ref)
        # The loss is one number whose bf16 error can land near zero by chance: floor its bar at
        # half a bf16 unit in the last place.
        loss_tol, grad_tol = max(2 * hf_loss_err, 2.0**-9), 2 * hf_grad_err
        # Several workers on one GPU are virtual (threads, distflash between them). Each policy
        # on every layer (--whole-layers 0: on one GPU `auto` keeps this small model whole),
        # then the last layer whole above remat ones.
        cases = [(1, "remat", "0"), (1, "layer", "0"), (1, "none", "0"), (2, "remat", "0"),
                 (3, "layer", "0"), (1, "remat", "1")]
        bar = {"transformers_bf16_loss_relative_error": hf_loss_err,
               "transformers_bf16_max_gradient_relative_error": hf_grad_err,
               "tolerance": "2x transformers' bf16 error"}
        print(f"transformers bf16: loss rel error {hf_loss_err:.2e}, worst gradient rel error "
              f"{hf_grad_err:.2e}")

    runs = []
    for workers, checkpoint, whole in cases:
        report, grads = ours(args.bin, model_dir, tokens_file, out / "grads.safetensors",
                             workers, checkpoint, whole, args.device)
        missing = sorted(set(grads_ref) - set(grads))
        if missing:
            sys.exit(f"distflash returned no gradient for {missing}")
        errors = errors_against(grads, grads_ref)
        loss_err = abs(report["loss"] - loss_ref) / abs(loss_ref)
        worst = max(errors, key=errors.get)
        runs.append({
            "workers": workers,
            "checkpoint": checkpoint,
            "whole_layers": whole,
            "loss": report["loss"],
            "loss_relative_error": loss_err,
            "max_gradient_relative_error": errors[worst],
            "worst_tensor": worst,
            "gradient_relative_error": errors,
            "passed": loss_err <= loss_tol and errors[worst] <= grad_tol,
        })
        print(f"workers {workers} checkpoint {checkpoint} whole layers {whole}: "
              f"loss {report['loss']:.8f} vs "
              f"{loss_ref:.8f} (rel {loss_err:.2e}), worst gradient rel error "
              f"{errors[worst]:.2e} ({worst})")
    result = {
        "what": f"distflash grads vs transformers {MODELS[args.model_type][1].__name__} "
                "(float64 reference)",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "config": {k: getattr(config, k, None) for k in [
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "tie_word_embeddings"]} | {"rope_theta": 500000.0,
                                       "rope_scaling": ROPE_SCALINGS[args.rope_scaling],
                                       "model_type": args.model_type,
                                       "attention_bias": args.attention_bias,
                                       "sliding_window": args.sliding_window},
        "device": args.device,
        "seq_len": seq_len,
        "loss_reference": loss_ref,
        **bar,
        "runs": runs,
        "passed": all(r["passed"] for r in runs),
    }
    name = "hf_parity.json" if args.device == "cpu" else "hf_parity_cuda.json"
    if args.rope_scaling != "none":
        name = name.replace(".json", f"_{args.rope_scaling}.json")
    if args.model_type != "llama" or args.attention_bias:
        kind = args.model_type + ("_bias" if args.attention_bias else "")
        if args.sliding_window is not None:
            kind += f"_window{args.sliding_window}"
        name = name.replace(".json", f"_{kind}.json")
    if args.tie_word_embeddings:
        name = name.replace(".json", "_tied.json")
    (out / name).write_text(json.dumps(result, indent=2))
    print("PASSED" if result["passed"] else "FAILED")
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()

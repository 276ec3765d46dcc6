#!/usr/bin/env python3
"""Hugging Face transformers' training step on one GPU, the peer of `distflash bench train`.

A LLaMA-7B-shaped LlamaForCausalLM (hidden 4096, 32 heads, intermediate 11008, vocabulary 32000,
32 layers or --layers N) built from a LlamaConfig with random weights (no download), bf16, SDPA
attention, batch 1. One step = forward with labels + backward, and with --optimizer adamw
torch's fused AdamW update (its moments in the parameters' bf16, created by the first step,
inside the peak); gradients dropped after each step (set to None). Warm-up steps, then the median of timed repeats, each
bracketed by torch.cuda.synchronize(). Peak memory is torch.cuda.max_memory_allocated over the
warm-up and repeats. An out-of-memory error is caught and reported as such.

Model FLOPs per step are counted as distflash counts them (model/cost.rs): 6·N·T + 6·L·T²·H·d,
N the parameters of matrix products (linear layers and the output projection), so MFU compares.

One JSON line per (sequence length, checkpointing) to stdout and appended to --out:

    python3 bench/peers/hf_train_bench.py --seq 16384,32768 --checkpointing both --out hf.jsonl
"""

import argparse
import gc
import json
import statistics
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

H200_BF16_PEAK_TFLOPS = 989.0


def llama7b(layers, seq):
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=max(seq, 4096),
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="sdpa",
    )


def step_flops(c, seq):
    d, i = c.hidden_size, c.intermediate_size
    head_dim = d // c.num_attention_heads
    q_w, kv_w = c.num_attention_heads * head_dim, c.num_key_value_heads * head_dim
    matmul = c.num_hidden_layers * (2 * d * q_w + 2 * d * kv_w + 3 * d * i) + c.vocab_size * d
    return 6.0 * matmul * seq + 6.0 * c.num_hidden_layers * seq * seq * q_w


def build(layers, seq, liger):
    if liger:
        # Liger's fused RMSNorm, SwiGLU, RoPE and linear cross-entropy (the logits never exist
        # whole): it patches transformers' Llama classes, so it must run before the model is made.
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True,
                                    fused_linear_cross_entropy=True, cross_entropy=False)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(llama7b(layers, seq))
    finally:
        torch.set_default_dtype(previous)
    return model


def measure(model, seq, checkpointing, warmup, repeats, optimizer=None):
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (1, seq), device="cuda")
    times = []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - began)
        model.zero_grad(set_to_none=True)
        del loss
    return times, torch.cuda.max_memory_allocated()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq", default="16384", help="comma-separated sequence lengths")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--checkpointing", choices=["on", "off", "both"], default="on")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--optimizer", choices=["none", "adamw"], default="none",
                   help="adamw: torch.optim.AdamW(fused=True, lr=1e-5) steps after each backward")
    p.add_argument("--liger", action="store_true",
                   help="transformers with Liger kernels (liger-kernel installed): fused RMSNorm, "
                        "SwiGLU, RoPE and linear cross-entropy")
    p.add_argument("--out", help="also append the JSON lines here")
    a = p.parse_args()
    seqs = [int(s) for s in a.seq.split(",") if s]
    modes = {"on": [True], "off": [False], "both": [True, False]}[a.checkpointing]
    out = open(a.out, "a") if a.out else None
    began = time.perf_counter()
    model = build(a.layers, max(seqs), a.liger)
    built_secs = time.perf_counter() - began
    optimizer = None
    if a.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    command = " ".join([sys.executable] + sys.argv)
    for seq in seqs:
        for ckpt in modes:
            line = {
                "impl": "hf_transformers_liger" if a.liger else "hf_transformers",
                "transformers": transformers.__version__,
                "torch": torch.__version__, "attention": "sdpa", "dtype": "bf16",
                "preset": "llama2-7b", "layers": a.layers, "seq": seq,
                "checkpoint": "hf_gradient_checkpointing" if ckpt else "none",
                "warmup": a.warmup, "repeats": a.repeats, "build_secs": built_secs,
                "optimizer": a.optimizer,
                "command": command,
            }
            try:
                times, peak = measure(model, seq, ckpt, a.warmup, a.repeats, optimizer)
                step = statistics.median(times)
                flops = step_flops(model.config, seq)
                line.update(
                    status="ok", step_secs=step, all_secs=times, tokens_per_sec=seq / step,
                    model_tflop_per_step=flops / 1e12, achieved_tflops=flops / step / 1e12,
                    mfu=flops / step / 1e12 / H200_BF16_PEAK_TFLOPS,
                    peak_memory_gib=peak / 2**30,
                )
            except torch.OutOfMemoryError as e:
                line.update(status="oom", error=str(e).split("\n")[0][:300],
                            peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
            model.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
            text = json.dumps(line)
            print(text, flush=True)
            if out:
                out.write(text + "\n")
                out.flush()


if __name__ == "__main__":
    main()

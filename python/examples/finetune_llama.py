"""Fine-tunes a small LLaMA whose attention is distflash's kernels (``attn_implementation="distattn"``).

    python3 python/examples/finetune_llama.py                 # a random tiny LLaMA, 300 steps
    python3 python/examples/finetune_llama.py --model DIR     # a transformers model folder

The data is a copy task: each sequence is random tokens followed by the same tokens again, so
the second half is predictable only by attending back across the sequence: the loss starts at
ln(vocab) and falls toward half of it once the model learns to copy (on the CPU, with the
kernels replaced by a stand-in, 30 steps were not enough to start; how many are is for the GPU
run to show). bf16 weights and activations, AdamW. One
JSON line a step (``--json FILE`` also writes them there).
"""
import argparse
import json
import tempfile

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import distflash.transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="a transformers model folder (default: a random tiny LLaMA)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--json")
    a = ap.parse_args()
    name = distflash.transformers.register()
    folder = a.model
    if folder is None:
        torch.manual_seed(0)
        folder = tempfile.mkdtemp()
        LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=a.seq_len)).save_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=name, dtype=torch.bfloat16).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = open(a.json, "w") if a.json else None
    for step in range(a.steps):
        half = torch.randint(0, vocab, (a.batch, a.seq_len // 2), device="cuda", generator=gen)
        ids = torch.cat([half, half], dim=1)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        line = json.dumps({"step": step, "loss": loss.item()})
        print(line, flush=True)
        if out:
            out.write(line + "\n")


if __name__ == "__main__":
    main()

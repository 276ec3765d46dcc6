"""Fine-tunes a small LLaMA whose attention is distflash's kernels (``attn_implementation="distattn"``).

    python3 python/examples/finetune_llama.py                 # a random tiny LLaMA, 300 steps
    python3 python/examples/finetune_llama.py --model DIR     # a transformers model folder

The data is text read as bytes (token = byte value; by default the Markdown files of the
repository this example sits in, or ``--text FILE ...``): random windows of ``--seq-len`` bytes.
A byte-level model learns the letters' and common words' statistics quickly, so the loss falls
from ln(vocab) = 6.2 to under 3 within a few hundred steps, which shows that the gradients
through distflash's attention train the model. bf16 weights and activations, AdamW. One JSON
line a step (``--json FILE`` also writes them there).
"""
import argparse
import json
import pathlib
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
    ap.add_argument("--text", nargs="+", help="text files to train on (default: the repository's Markdown)")
    ap.add_argument("--json")
    a = ap.parse_args()
    data = text_bytes(a.text)
    if data.numel() <= a.seq_len:
        raise SystemExit(f"the text holds {data.numel()} bytes; give --text files with more than --seq-len {a.seq_len}")
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
    if model.config.vocab_size < 256:
        raise SystemExit(f"the model's vocabulary ({model.config.vocab_size}) cannot hold byte tokens: give a model with at least 256")
    data = data.cuda()
    gen = torch.Generator(device="cuda").manual_seed(1)
    out = open(a.json, "w") if a.json else None
    for step in range(a.steps):
        starts = torch.randint(0, data.numel() - a.seq_len, (a.batch,), device="cuda", generator=gen)
        ids = data[starts[:, None] + torch.arange(a.seq_len, device="cuda")]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        line = json.dumps({"step": step, "loss": loss.item()})
        print(line, flush=True)
        if out:
            out.write(line + "\n")


def text_bytes(paths):
    """The bytes of `paths` (default: every Markdown file of the repository around this example)
    as one int64 tensor of token ids."""
    if not paths:
        root = pathlib.Path(__file__).resolve().parents[2]
        paths = sorted(p for p in root.rglob("*.md") if ".git" not in p.parts and "target" not in p.parts)
    raw = b"\n".join(pathlib.Path(p).read_bytes() for p in paths)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(torch.int64)


if __name__ == "__main__":
    main()

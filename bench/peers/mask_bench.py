"""Masks (packed documents, a sliding window, global tokens) beside PyTorch: accuracy, timing
and the summary of issue 19's criteria. The mask is given as distflash's flags are: --doc-len L
(documents of L tokens; the last takes the rest), --window W, --global G. Key k is visible to
query q iff k <= q and (k >= row_start[q] or k < G), row_start[q] = max(doc_start(q), q + 1 - W),
as in distflash (src/shape/mask.rs).

    # ours from `distflash attention --save f.safetensors --doc-lens ...` vs float64, beside
    # PyTorch's bf16 SDPA (explicit boolean mask) and FlexAttention (block mask, compiled):
    python3 bench/peers/mask_bench.py check f.safetensors --doc-len 1024
    # FlexAttention's forward and forward+backward times, one JSON line:
    python3 bench/peers/mask_bench.py time --seq 131072 --window 4096 --json flex.jsonl
    # the criteria from the JSON lines of both (ours: `distflash bench attention --json`):
    python3 bench/peers/mask_bench.py summary --ours ours.jsonl --flex flex.jsonl --checks checks.jsonl
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_against_torch import load, rel  # noqa: E402
from sdpa_bench import time_ms  # noqa: E402


def row_start(n, doc_len, window, device):
    """distflash's row_start for positions 0..n (int64 on `device`)."""
    q = torch.arange(n, device=device)
    start = (q // doc_len) * doc_len if doc_len else torch.zeros_like(q)
    if window:
        start = torch.maximum(start, q + 1 - window)
    return start


def visible(n, rs, glob):
    """The dense boolean mask [n, n] (True: the query sees the key)."""
    q = torch.arange(n, device=rs.device)[:, None]
    k = torch.arange(n, device=rs.device)[None, :]
    return (k <= q) & ((k >= rs[:, None]) | (k < glob))


def flex_call(n, rs, glob):
    """A compiled FlexAttention and its block mask for the same predicate."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & ((kv_idx >= rs[q_idx]) | (kv_idx < glob))

    bm = create_block_mask(mask_mod, None, None, n, n, device=rs.device, _compile=True)
    flex = torch.compile(flex_attention)
    return lambda q, k, v: flex(q, k, v, block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])


def check(args):
    t, meta = load(args.file)
    dev = "cuda"
    low = torch.float16 if meta.get("dtype") == "fp16" else torch.bfloat16
    hm = lambda x: x.to(dev).transpose(1, 2).contiguous()  # [b,n,h,d] -> [b,h,n,d]
    q, k, v, dout = (hm(t[x]) for x in ("q", "k", "v", "dout"))
    n, group = q.shape[2], q.shape[1] // k.shape[1]
    rs = row_start(n, args.doc_len, args.window, dev)
    vis = visible(n, rs, args.glob)

    def dense(q, k, v):
        k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
        s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        return torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1) @ v

    def grads(fn, dtype):
        xs = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = fn(*xs)
        return [out, *torch.autograd.grad(out, xs, dout.to(dtype))]

    ref = grads(dense, torch.float64)
    sdpa = grads(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=vis, enable_gqa=group > 1), low)
    flex = grads(flex_call(n, rs, args.glob), low)
    ours = [hm(t[x]) for x in ("out", "dq", "dk", "dv")]
    report = {"file": args.file, "seq": n, "heads": q.shape[1], "kv_heads": k.shape[1],
              "dtype": str(low).replace("torch.", ""), "doc_len": args.doc_len,
              "window": args.window, "global": args.glob}
    ok = True
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        row = {"ours": rel(ours[i], ref[i]), "torch_sdpa": rel(sdpa[i], ref[i]),
               "torch_flex": rel(flex[i], ref[i])}
        # PyTorch's own bf16 error under the mask: the better of its two kernels.
        row["torch_best"] = min(row["torch_sdpa"], row["torch_flex"])
        row["ratio"] = row["ours"] / row["torch_best"] if row["torch_best"] > 0 else float("inf")
        ok &= row["ratio"] <= 2.0
        report[name] = row
    report["pass"] = bool(ok)
    print(json.dumps(report))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(report) + "\n")
    return 0 if ok else 1


def time(args):
    dtype = torch.bfloat16
    n, h, d = args.seq, args.heads, args.head_dim
    gen = torch.Generator(device="cuda").manual_seed(7)
    shape = (1, h, n, d)
    q, k, v = [(torch.rand(shape, device="cuda", generator=gen) * 4 - 2).to(dtype).requires_grad_()
               for _ in range(3)]
    dout = (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
    rs = row_start(n, args.doc_len, args.window, "cuda")
    run = flex_call(n, rs, args.glob)
    fwd = lambda: run(q, k, v)

    def fwdbwd():
        torch.autograd.grad(run(q, k, v), (q, k, v), dout)

    with torch.no_grad():
        for _ in range(3):
            fwd()
    for _ in range(3):
        fwdbwd()
    torch.cuda.synchronize()
    with torch.no_grad():
        fwd_ms = time_ms(fwd, args.reps)
    fwdbwd_ms = time_ms(fwdbwd, args.reps)
    line = {"impl": "flex_attention", "dtype": "bf16", "seq": n, "heads": h, "head_dim": d,
            "doc_len": args.doc_len, "window": args.window, "global": args.glob,
            "fwd_ms": fwd_ms, "fwdbwd_ms": fwdbwd_ms, "reps": args.reps,
            "torch": torch.__version__}
    print(json.dumps(line))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


def summary(args):
    """Ours against the ideal (our causal time × the mask's visible fraction; criterion 1.2×)
    and beside FlexAttention, and the accuracy criterion, as one JSON object."""
    read = lambda p: [json.loads(l) for l in open(p) if l.strip()]
    ours = read(args.ours)
    causal = next(l for l in ours if l["mask"] == "causal")
    flex = read(args.flex)
    out = {"causal": {"fwd_ms": causal["fwd_ms"], "fwdbwd_ms": causal["fwd_ms"] + causal["bwd_ms"]},
           "masks": [], "checks": read(args.checks) if args.checks else []}
    ok = all(c["pass"] for c in out["checks"])
    for line, fl in zip([l for l in ours if l["mask"] != "causal"], flex):
        frac = line["visible_fraction"]
        fb = line["fwd_ms"] + line["bwd_ms"]
        row = {"mask": line["mask"], "visible_fraction": frac,
               "fwd_ms": line["fwd_ms"], "fwdbwd_ms": fb,
               "fwd_over_ideal": line["fwd_ms"] / (causal["fwd_ms"] * frac),
               "fwdbwd_over_ideal": fb / (out["causal"]["fwdbwd_ms"] * frac),
               "flex_fwd_ms": fl["fwd_ms"], "flex_fwdbwd_ms": fl["fwdbwd_ms"],
               "flex_mask": {"doc_len": fl["doc_len"], "window": fl["window"]}}
        row["pass"] = row["fwd_over_ideal"] <= 1.2 and row["fwdbwd_over_ideal"] <= 1.2
        ok &= row["pass"]
        out["masks"].append(row)
    out["pass"] = bool(ok)
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "time"):
        p = sub.add_parser(name)
        p.add_argument("--doc-len", type=int, default=0)
        p.add_argument("--window", type=int, default=0)
        p.add_argument("--global", dest="glob", type=int, default=0)
        p.add_argument("--json")
    sub.choices["check"].add_argument("file")
    t = sub.choices["time"]
    t.add_argument("--seq", type=int, default=131072)
    t.add_argument("--heads", type=int, default=32)
    t.add_argument("--head-dim", type=int, default=128)
    t.add_argument("--reps", type=int, default=10)
    s = sub.add_parser("summary")
    s.add_argument("--ours", required=True)
    s.add_argument("--flex", required=True)
    s.add_argument("--checks")
    s.add_argument("--json")
    args = ap.parse_args()
    sys.exit({"check": check, "time": time, "summary": summary}[args.cmd](args))


if __name__ == "__main__":
    main()

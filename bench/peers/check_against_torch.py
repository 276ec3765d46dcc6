"""Checks distflash's attention outputs against PyTorch in float64, next to PyTorch's own
16-bit SDPA on the same inputs (the FlashAttention test suite's criterion: our error may be at
most 2x that of the framework's low-precision kernel).

The file (from `cuda_attn dump`) holds f32 tensors: q, dout, out, dq `[b, seq, heads, d]`;
k, v, dk, dv `[b, seq, kv_heads, d]`; lse `[b, heads, seq]`; metadata "dtype" (bf16 or fp16).
Causal; GQA by repeating each KV head for its group of query heads.

    python3 bench/peers/check_against_torch.py ours.safetensors
"""
import json
import struct
import sys

import torch
import torch.nn.functional as F


def load(path):
    """Minimal safetensors reader (f32 only), so the check needs nothing beyond torch."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{name}: expected F32, got {info['dtype']}"
        a, b = info["data_offsets"]
        tensors[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(info["shape"])
    return tensors, meta


def attention(q, k, v, group):
    """q [b,h,n,d], k/v [b,kvh,n,d] → (out, lse) computed plainly (float64 when given f64)."""
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    n = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.softmax(s, dim=-1) @ v, lse


def rel(x, ref):
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm()).item()


def main():
    t, meta = load(sys.argv[1])
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    low = torch.float16 if meta.get("dtype") == "fp16" else torch.bfloat16
    hm = lambda x: x.to(dev).transpose(1, 2).contiguous()  # [b,n,h,d] -> [b,h,n,d]
    q, k, v, dout = (hm(t[x]) for x in ("q", "k", "v", "dout"))
    group = q.shape[1] // k.shape[1]

    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    out64, lse64 = attention(q64, k64, v64, group)
    dq64, dk64, dv64 = torch.autograd.grad(out64, (q64, k64, v64), dout.double())

    ql, kl, vl = (x.to(low).requires_grad_() for x in (q, k, v))
    outl = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True, enable_gqa=group > 1)
    dql, dkl, dvl = torch.autograd.grad(outl, (ql, kl, vl), dout.to(low))

    ours = {"out": hm(t["out"]), "dq": hm(t["dq"]), "dk": hm(t["dk"]), "dv": hm(t["dv"]),
            "lse": t["lse"].to(dev)}
    refs = {"out": out64, "dq": dq64, "dk": dk64, "dv": dv64, "lse": lse64}
    torch_low = {"out": outl, "dq": dql, "dk": dkl, "dv": dvl}
    ok = True
    report = {"file": sys.argv[1], "shape": list(t["q"].shape), "kv_heads": k.shape[1],
              "dtype": str(low).replace("torch.", "")}
    for name in ("out", "lse", "dq", "dk", "dv"):
        e_ours = rel(ours[name], refs[name])
        row = {"ours": e_ours}
        if name in torch_low:
            e_torch = rel(torch_low[name], refs[name])
            row["torch_sdpa"] = e_torch
            row["ratio"] = e_ours / e_torch if e_torch > 0 else float("inf")
            # LSE has no framework counterpart here; the outputs and gradients must stay within 2x.
            ok &= e_ours <= 2 * e_torch
        else:
            ok &= e_ours < 1e-3
        report[name] = row
    report["pass"] = bool(ok)
    print(json.dumps(report))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""On the GPU machine: where the binding's time goes at short lengths, against the kernels alone.

`distflash.flash_attn` and the head-major `attend_head_major` (forward, then the autograd
backward) run under torch.profiler at each --seqs (batch 1, --heads heads, head dim --dim,
bf16); for each, the GPU kernels' summed time per iteration (by kernel name) beside the
CUDA-event time of the same iteration. Their gap is GPU idle time (the host not keeping up);
the kernels other than distflash's are what the binding adds (transposes, roundings).

    python3 bench/peers/binding_profile.py --seqs 4096,16384 --out $OUT/binding_profile.json
"""
import argparse
import json

import torch
from torch.profiler import ProfilerActivity, profile

import distflash
import distflash.attention
from torch_binding import chained_ms  # beside this script

ITERS = 20


def step(fn, xs, dout):
    out = fn(*xs)
    torch.autograd.grad(out, xs, dout)


def measure(name, fn, xs, dout):
    for _ in range(2):  # and chained_ms's own warm-up step: three
        step(fn, xs, dout)
    event_ms = chained_ms(lambda: step(fn, xs, dout), ITERS)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            step(fn, xs, dout)
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if e.device_type == torch.autograd.DeviceType.CUDA and t > 0:
            kernels[e.key] = t / 1000 / ITERS
    kernel_ms = sum(kernels.values())
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:12])
    row = {"impl": name, "event_ms": event_ms, "kernel_ms": kernel_ms,
           "idle_ms": event_ms - kernel_ms, "kernels_ms": top}
    print(json.dumps(row))
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for n in map(int, a.seqs.split(",")):
        g = torch.Generator(device="cuda").manual_seed(3)
        mk = lambda shape: (torch.rand(shape, device="cuda", generator=g) * 4 - 2).to(torch.bfloat16)
        hm = [mk((1, a.heads, n, a.dim)).requires_grad_() for _ in range(3)]
        bshd = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in hm]
        dout_hm, dout_bshd = mk((1, a.heads, n, a.dim)), mk((1, n, a.heads, a.dim))
        for name, fn, xs, dout in [
            ("head_major", lambda *x: distflash.attention.attend_head_major(*x)[0], hm, dout_hm),
            ("flash_attn", distflash.flash_attn, bshd, dout_bshd),
        ]:
            row = measure(name, fn, xs, dout)
            row["seq"] = n
            rows.append(row)
    json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()

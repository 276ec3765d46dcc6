"""Times PyTorch SDPA (FlashAttention-2 and cuDNN backends) on the shapes distflash's
`cuda_attn bench` times: causal, batch 1, `--heads` heads, head dims and sequence lengths as
given, bf16 by default. FLOPs are counted as in distflash (forward 4·N²·H·d/2, backward 2.5×).
Prints one JSON object per (backend, head_dim, seq) line and optionally writes them to --json.

    python3 bench/peers/sdpa_bench.py --seqs 4096,16384,65536 --head-dims 128,64 --json sdpa.jsonl
"""
import argparse
import contextlib
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F


# Device time each measured operation runs before it is timed: under full load an H200's SM
# clock steps down at its power limit after ~25 ms, so a cold start times the first steps' clock
# (bench/results/gqa-cta-2026-12-04, call 5). distflash's timer (WARM_MS in
# src/backend/cuda/timing.rs) loads its kernels alike.
WARM_MS = 1000.0


def warm_up(fn):
    """Times a first run of fn, then runs it for about WARM_MS; returns the first run's time."""
    first = time_ms(fn, 1)
    for _ in range(int(-(-WARM_MS // max(first, 1e-3)))):
        fn()
    torch.cuda.synchronize()
    return first


def time_ms(fn, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="4096,16384,65536")
    ap.add_argument("--head-dims", default="128,64")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=None,
                    help="key/value heads (GQA: fewer than --heads; SDPA's enable_gqa)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--json")
    ap.add_argument("--default", action="store_true",
                    help="also time SDPA with no backend forced (PyTorch's own choice)")
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    lines = []
    for d in [int(x) for x in args.head_dims.split(",")]:
        for n in [int(x) for x in args.seqs.split(",")]:
            gen = torch.Generator(device="cuda").manual_seed(7)
            shape = (1, args.heads, n, d)
            kv_heads = args.kv_heads or args.heads
            q, k, v = [(torch.rand(s, device="cuda", generator=gen, dtype=torch.float32) * 4 - 2)
                       .to(dtype).requires_grad_()
                       for s in (shape, (1, kv_heads, n, d), (1, kv_heads, n, d))]
            gqa = {"enable_gqa": True} if kv_heads != args.heads else {}
            dout = (torch.rand(shape, device="cuda", generator=gen) * 2 - 1).to(dtype)
            fwd_flops = 4 * n * n * args.heads * d / 2
            # sdpa_default: no backend forced, PyTorch's own choice (what Hugging Face's SDPA
            # attention gets).
            for name, backend in [("sdpa_flash2", SDPBackend.FLASH_ATTENTION),
                                  ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                                  ("sdpa_default", None)]:
                if name == "sdpa_default" and not args.default:
                    continue
                try:
                    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                        run = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
                        out = run()
                        grad = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                        grad()
                        torch.cuda.synchronize()
                        first = warm_up(run)
                        reps = max(3, min(30, int(1000 / max(first, 1e-3))))
                        f_ms = time_ms(run, reps)
                        warm_up(grad)
                        b_ms = time_ms(grad, reps)
                except RuntimeError as e:  # a backend that refuses a shape is reported, not fatal
                    line = {"impl": name, "seq": n, "head_dim": d, "error": str(e).splitlines()[0]}
                else:
                    tf = lambda flops, ms: flops / (ms * 1e-3) / 1e12
                    line = {"impl": name, "dtype": args.dtype, "seq": n, "heads": args.heads,
                            "kv_heads": kv_heads, "head_dim": d, "fwd_ms": round(f_ms, 4), "bwd_ms": round(b_ms, 4),
                            "fwd_tflops": round(tf(fwd_flops, f_ms), 1),
                            "bwd_tflops": round(tf(2.5 * fwd_flops, b_ms), 1),
                            "fwdbwd_tflops": round(tf(3.5 * fwd_flops, f_ms + b_ms), 1),
                            "reps": reps, "torch": torch.__version__,
                            "cudnn": torch.backends.cudnn.version(),
                            "command": "python3 " + " ".join(sys.argv)}
                print(json.dumps(line), flush=True)
                lines.append(line)
            del q, k, v, dout
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    main()

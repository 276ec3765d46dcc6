"""Times PyTorch's context parallel (ring attention over a device mesh, head-tail load
balancing on) for causal SDPA forward+backward, the peer of `distflash launch ... attention
--device cuda`. Run under torchrun, one process per GPU:

    torchrun --nproc-per-node 2 bench/peers/context_parallel_bench.py --seqs 32768,131072 \\
        --json cp.jsonl

For each sequence length, SDPA backend (FlashAttention-2, cuDNN) and rotate method (allgather,
alltoall) rank 0 prints one JSON line with the median forward+backward time (CUDA events,
after warm-up). FLOPs are counted as in distflash (forward 4·N²·H·d/2, backward 2.5×).
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps):
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    # Every rank's time for a repeat is the slowest rank's: the step ends when all end.
    t = torch.tensor(times, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return sorted(t.tolist())[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="32768,131072")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda", (world,))
    _cp_options.enable_load_balance = True
    lines = []
    for n in [int(x) for x in args.seqs.split(",")]:
        gen = torch.Generator(device="cuda").manual_seed(7)  # the same full tensors on every rank
        make = lambda heads, amp: ((torch.rand((1, heads, n, args.head_dim), device="cuda",
                                               generator=gen) * 2 - 1) * amp).to(torch.bfloat16)
        q, k, v = make(args.heads, 2.0), make(args.kv_heads, 2.0), make(args.kv_heads, 1.0)
        dout = make(args.heads, 1.0)
        flops = 3.5 * 4 * n * n * args.heads * args.head_dim / 2
        for name, backend in [("flash2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
            for rotate in ["allgather", "alltoall"]:
                set_rotate_method(rotate)
                cq, ck, cv, cd = (t.clone() for t in (q, k, v, dout))
                line = {"impl": f"torch_cp_{name}_{rotate}", "gpus": world, "seq": n, "heads": args.heads,
                        "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                        "command": "torchrun --nproc-per-node %d " % world + " ".join(sys.argv)}
                try:
                    with sdpa_kernel(backend), context_parallel(mesh, buffers=[cq, ck, cv, cd],
                                                                buffer_seq_dims=[2, 2, 2, 2]):
                        for t in (cq, ck, cv):
                            t.requires_grad_(True)

                        def step():
                            out = F.scaled_dot_product_attention(cq, ck, cv, is_causal=True,
                                                                 enable_gqa=args.kv_heads != args.heads)
                            out.backward(cd)

                        step()
                        step()
                        ms = median_ms(step, args.reps)
                    line.update(fwdbwd_ms=round(ms, 3), fwdbwd_tflops=round(flops / (ms * 1e-3) / 1e12, 1))
                except Exception as e:  # a configuration the installed PyTorch refuses is reported
                    line["error"] = str(e).splitlines()[0][:300]
                if rank == 0:
                    print(json.dumps(line), flush=True)
                lines.append(line)
                del cq, ck, cv, cd
                torch.cuda.empty_cache()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in lines))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

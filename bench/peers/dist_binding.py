"""On the GPU machine: `distflash.dist_flash_attn` (python/, wheel from build_wheel.sh) checked.

1. virtual ranks: on one GPU, a `distflash.VirtualGroup` of 1, 2, 3 and 4 ranks (threads of
   this process over distflash's in-process communicator; NCCL refuses two ranks on one GPU),
   balanced and zigzag: the whole bf16/fp16 sequence cut with `split_sequence`, every rank's
   chunk through `dist_flash_attn`, the outputs put back with `join_sequence`, the gradients
   flowing back through the cuts to the whole q, k, v. Against float64 SDPA on the same
   inputs, next to PyTorch's own 16-bit SDPA and `distflash.flash_attn` on the whole
   sequence; pass: out, dq, dk, dv each within 2x SDPA's error, for `dist_flash_attn` and
   `flash_attn` alike (so several ranks equal one, within the precision's noise; their
   distance from each other is reported beside, as `dist_vs_flash_attn`); then the same on 2
   and 4 ranks under masks over the whole sequence (documents across the ranks' chunks, a
   window with global tokens), SDPA given the mask as an explicit boolean matrix;
2. a torch.distributed group: the NCCL path (distflash's NCCL communicator, its id broadcast
   by the group) in a one-process world, the same check; its refusals (a call before
   init_process_group, a list of chunks, an odd zigzag chunk) answered with the sentence;
3. LSE (`return_lse=True`): every rank's, joined with `join_sequence(..., dim=2)`, against
   `flash_attn`'s on the whole sequence, virtual ranks 2 and 4 and the one-process NCCL group,
   both schedules, causal and under documents; pass: within 1e-3 absolute (as
   torch_binding.py's LSE check), far below an indexing bug's O(1);
4. errors: ranks of unequal chunks, a CPU tensor, answered with the sentence, no crash.

Writes one JSON object to --out; exit status 1 if any check fails.
    python3 bench/peers/dist_binding.py --out $OUT/dist_binding.json
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import distflash
from torch_binding import rel, sdpa_bshd, visible  # beside this script

CASES = [  # batch, seq, heads, kv_heads, head_dim, dtype: seq a multiple of 2 x 1, 2, 3, 4
    (1, 1200, 8, 2, 128, torch.bfloat16),
    (2, 480, 4, 4, 64, torch.bfloat16),
    (1, 960, 8, 1, 128, torch.float16),
]

# Masks over the whole sequence (flash_attn's keyword arguments): documents across the ranks'
# chunks with a one-token one, and a window with global tokens; the first case's shape.
MASKS = [
    {"doc_lens": [1, 500, 299, 400]},
    {"window": 100, "global_tokens": 3},
]


def grads_of(fn, inputs, dout, cast):
    x = [t.to(cast).requires_grad_() for t in inputs]
    out = fn(*x)
    return (out.detach(), *torch.autograd.grad(out, x, dout.to(cast)))


def through(world, schedule, attend):
    """Whole-sequence attention made of the ranks' chunks: split, `attend`, join."""
    def fn(q, k, v):
        cut = lambda t: [distflash.split_sequence(t, world, r, schedule) for r in range(world)]  # noqa: E731
        return distflash.join_sequence(attend(cut(q), cut(k), cut(v)), schedule)
    return fn


def inputs(b, n, h, hk, d, dt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda heads: torch.randn(b, n, heads, d, device="cuda", generator=g).to(dt)  # noqa: E731
    return mk(h), mk(hk), mk(hk), mk(h)


def judge(row, got, ref, sdpa, flash):
    """Adds got's errors beside SDPA's and flash_attn's; True when within 2x SDPA's."""
    passed = True
    for i, what in enumerate(["out", "dq", "dk", "dv"]):
        ours, theirs = rel(got[i], ref[i]), rel(sdpa[i], ref[i])
        row[what] = {"dist": ours, "flash_attn": rel(flash[i], ref[i]), "sdpa": theirs,
                     "ratio": ours / max(theirs, 1e-12), "dist_vs_flash_attn": rel(got[i], flash[i])}
        passed &= ours <= 2 * theirs and rel(flash[i], ref[i]) <= 2 * theirs
    row["passed"] = bool(passed)
    print(json.dumps(row))
    return passed


def references(q, k, v, dout, dt, mask=None):
    """float64 and 16-bit SDPA (under `mask` as an explicit boolean matrix) and flash_attn."""
    seen = visible(q.shape[1], **mask) if mask else None
    sdpa = lambda a, bb, c: sdpa_bshd(a, bb, c, seen)  # noqa: E731
    flash = lambda a, bb, c: distflash.flash_attn(a, bb, c, **(mask or {}))  # noqa: E731
    return (grads_of(sdpa, (q, k, v), dout, torch.float64),
            grads_of(sdpa, (q, k, v), dout, dt),
            grads_of(flash, (q, k, v), dout, dt))


def virtual_ranks():
    rows, ok = [], True
    for b, n, h, hk, d, dt in CASES:
        q, k, v, dout = inputs(b, n, h, hk, d, dt, 2000 + n)
        ref, sdpa, flash = references(q, k, v, dout, dt)
        for world in (1, 2, 3, 4):
            group = distflash.VirtualGroup(world)
            for schedule in distflash.SCHEDULES:
                attend = lambda qs, ks, vs: distflash.dist_flash_attn(qs, ks, vs, group=group, schedule=schedule)  # noqa: E731
                got = grads_of(through(world, schedule, attend), (q, k, v), dout, dt)
                row = {"path": "virtual", "world": world, "schedule": schedule, "batch": b, "seq": n,
                       "heads": h, "kv_heads": hk, "head_dim": d, "dtype": str(dt)}
                ok &= judge(row, got, ref, sdpa, flash)
                rows.append(row)
    b, n, h, hk, d, dt = CASES[0]
    q, k, v, dout = inputs(b, n, h, hk, d, dt, 2500)
    for mask in MASKS:
        ref, sdpa, flash = references(q, k, v, dout, dt, mask)
        for world in (2, 4):
            group = distflash.VirtualGroup(world)
            for schedule in distflash.SCHEDULES:
                attend = lambda qs, ks, vs: distflash.dist_flash_attn(  # noqa: E731
                    qs, ks, vs, group=group, schedule=schedule, **mask)
                got = grads_of(through(world, schedule, attend), (q, k, v), dout, dt)
                row = {"path": "virtual", "world": world, "schedule": schedule, "mask": mask, "batch": b,
                       "seq": n, "heads": h, "kv_heads": hk, "head_dim": d, "dtype": str(dt)}
                ok &= judge(row, got, ref, sdpa, flash)
                rows.append(row)
    return rows, ok


def refused(exc, match, fn):
    """Whether fn raises exc with `match` in its message (printed either way)."""
    try:
        fn()
    except exc as e:
        good = match in str(e)
        print(json.dumps({"refusal": match, "got": str(e), "passed": good}))
        return good
    except Exception as e:  # noqa: BLE001 - any other exception is a failed check
        print(json.dumps({"refusal": match, "got": f"{type(e).__name__}: {e}", "passed": False}))
        return False
    print(json.dumps({"refusal": match, "got": "no error", "passed": False}))
    return False


def lse_rows():
    """dist_flash_attn's LSE, joined, against flash_attn's over the whole sequence."""
    rows, ok = [], True
    b, n, h, hk, d, dt = CASES[0]
    q, k, v, _ = inputs(b, n, h, hk, d, dt, 3500)
    for mask in [{}, MASKS[0]]:
        _, want = distflash.flash_attn(q, k, v, return_lse=True, **mask)
        for world in (2, 4):
            group = distflash.VirtualGroup(world)
            for schedule in distflash.SCHEDULES:
                cut = lambda t: [distflash.split_sequence(t, world, r, schedule) for r in range(world)]  # noqa: E731
                _, lses = distflash.dist_flash_attn(cut(q), cut(k), cut(v), group=group, schedule=schedule,
                                                    return_lse=True, **mask)
                got = distflash.join_sequence(lses, schedule, dim=2)
                row = {"path": "virtual", "world": world, "schedule": schedule, "mask": mask,
                       "lse_abs_err": (got - want).abs().max().item()}
                row["passed"] = row["lse_abs_err"] <= 1e-3
                ok &= row["passed"]
                rows.append(row)
                print(json.dumps(row))
    return rows, ok


def process_group():
    rows, ok = [], True
    b, n, h, hk, d, dt = CASES[0]
    q, k, v, dout = inputs(b, n, h, hk, d, dt, 3000)
    ok &= refused(RuntimeError, "needs torch.distributed.init_process_group first", lambda: distflash.dist_flash_attn(q, k, v))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    ref, sdpa, flash = references(q, k, v, dout, dt)
    for schedule in distflash.SCHEDULES:
        for call in ("first", "cached"):  # the second call reuses the cached communicator
            fn = lambda a, bb, c: distflash.dist_flash_attn(a, bb, c, schedule=schedule)  # noqa: E731
            got = grads_of(fn, (q, k, v), dout, dt)
            row = {"path": "torch.distributed (NCCL, world 1)", "call": call, "schedule": schedule,
                   "batch": b, "seq": n, "heads": h, "kv_heads": hk, "head_dim": d, "dtype": str(dt)}
            ok &= judge(row, got, ref, sdpa, flash)
            rows.append(row)
        _, lse = distflash.dist_flash_attn(q, k, v, schedule=schedule, return_lse=True)
        _, want = distflash.flash_attn(q, k, v, return_lse=True)
        # One rank's chunk is the whole sequence, in the schedule's order of its parts.
        want = distflash.split_sequence(want, 1, 0, schedule, dim=2)
        row = {"path": "torch.distributed (NCCL, world 1)", "schedule": schedule,
               "lse_abs_err": (lse - want).abs().max().item()}
        row["passed"] = row["lse_abs_err"] <= 1e-3
        ok &= row["passed"]
        rows.append(row)
        print(json.dumps(row))
    ok &= refused(TypeError, "lists of every rank's chunk go with group=distflash.VirtualGroup",
                  lambda: distflash.dist_flash_attn([q], [k], [v]))
    odd = [t[:, :n - 1].contiguous() for t in (q, k, v)]
    ok &= refused(ValueError, "an odd number; under 'zigzag'", lambda: distflash.dist_flash_attn(*odd, schedule="zigzag"))
    dist.destroy_process_group()
    return rows, ok


def errors():
    b, n, h, hk, d, dt = CASES[0]
    q, k, v, _ = inputs(b, n, h, hk, d, dt, 4000)
    group = distflash.VirtualGroup(2)
    ok = refused(ValueError, "every rank holds an equal chunk",
                 lambda: distflash.dist_flash_attn([q, q[:, :-2]], [k, k[:, :-2]], [v, v[:, :-2]], group=group))
    ok &= refused(ValueError, "q is on cpu", lambda: distflash.dist_flash_attn([q.cpu()] * 2, [k] * 2, [v] * 2, group=group))
    ok &= refused(ValueError, "VirtualGroup(2) has 2 ranks, but 1 q chunks",
                  lambda: distflash.dist_flash_attn([q], [k], [v], group=group))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    virtual, ok_virtual = virtual_ranks()
    lse, ok_lse = lse_rows()
    process, ok_process = process_group()
    ok_errors = errors()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "virtual": virtual, "lse": lse, "process_group": process,
              "passed": {"virtual": ok_virtual, "lse": ok_lse, "process_group": ok_process, "errors": ok_errors}}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    ok = ok_virtual and ok_lse and ok_process and ok_errors
    print(f"dist_binding: virtual ranks {'PASS' if ok_virtual else 'FAIL'}, LSE {'PASS' if ok_lse else 'FAIL'}, "
          f"torch.distributed {'PASS' if ok_process else 'FAIL'}, errors {'PASS' if ok_errors else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

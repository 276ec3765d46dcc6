"""``dist_flash_attn``: distflash's distributed causal attention, each rank passing its chunk.

A sequence of ``S`` tokens is split across the ``P`` ranks of a group; rank ``r`` passes its
chunk ``[batch, S/P, heads, head_dim]`` (:func:`split_sequence` cuts it, :func:`join_sequence`
puts the ranks' outputs back in order) and gets the output of its rows: causal attention over
the whole sequence so far, exactly, though no rank ever holds the whole sequence. Differentiable
in q, k and v; the backward runs distflash's distributed backward among the same ranks.

Schedules (``schedule=``):

- ``"balanced"`` (DistFlashAttn's): rank r holds the r-th of P consecutive chunks; idle ranks
  compute blocks for busy ones and return partial results. Any chunk length.
- ``"zigzag"``: the sequence is cut into 2P chunks and rank r holds chunks r and 2P - 1 - r
  (one early, one late), so every step is equally heavy; the better choice for 2 ranks. Each
  rank's chunk is its two halves one after the other: the chunk length must be even, the
  sequence a multiple of 2P.

Transport. The schedule runs over distflash's own communicator, not torch's P2P operations:
the plan fixes every transfer (which chunk, which step, which payload: its tag), the executor
posts step t + 1's fetches before step t computes (prefetch) and receives into buffers it sizes
from the plan; that is what distflash's NCCL communicator was written for, and what its tests
check. Rebuilding it from ``torch.distributed.batch_isend_irecv`` would duplicate the plan's
bookkeeping in Python, outside those tests, for no transfer distflash cannot make itself.

- Between processes (``group`` a ``torch.distributed`` process group, default the world): NCCL.
  Rank 0 of the group draws an NCCL unique id, ``torch.distributed.broadcast_object_list``
  hands it to the others, and each process joins distflash's NCCL communicator on its GPU and
  torch's current stream. One communicator is cached per (group, device, dtype, stream); the
  first call of each builds it, collectively. Every call first all-gathers each rank's shape
  and schedule over the group (one 7-integer collective and one host sync), so ranks that
  disagree get a ValueError instead of NCCL transfers that never match.
- On one GPU (``group`` a :class:`VirtualGroup`): NCCL refuses two ranks on one GPU, so the
  group's ranks are threads of this process sharing the GPU and torch's stream, joined by
  distflash's in-process communicator (what ``distflash attention --device cuda --workers N``
  runs). The same per-rank function, plans and executor as NCCL ranks; only the transport
  differs. One call passes every rank's chunk (lists of P tensors) and returns every rank's
  output: ranks as Python threads each calling for itself would deadlock in the backward,
  because torch's autograd runs every CUDA backward of a device on one engine thread, so the
  ranks' backwards would run one after another while each waits for the others.

Memory. The executor allocates, sends, receives into and frees its own tensors, so each rank's
chunk is copied into them (head-major, device to device, on torch's stream) and the results
copied out: while a pass runs a rank's q, k, v are held twice (torch's head-major copies and
the executor's), its output once in float32 beside the input dtype, and in the backward dO and
the float32 gradients twice, beside the executor's own buffers. The autograd function keeps
the head-major q, k, v, the output (input dtype) and the LSE (float32) of each own chunk for
the backward, as ``flash_attn`` does.

torch is imported on first use; the argument checks (and :func:`chunk_spans`) run without it.
"""

import zlib

from . import _checks

SCHEDULES = ("balanced", "zigzag")

_FUNCTIONS = {}
_NCCL_GROUPS = {}


def _check_schedule(schedule):
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use 'balanced' or 'zigzag'")


def _check_world(world):
    if isinstance(world, bool) or not isinstance(world, int):
        raise TypeError(f"the world size must be an int, got {type(world).__name__}")
    if world < 1:
        raise ValueError(f"the world size is {world}; a group needs at least one rank")


def chunk_spans(seq, world, rank, schedule="balanced"):
    """The ``(start, stop)`` token ranges of the sequence that rank ``rank`` of ``world``
    holds under ``schedule``, in sequence order (one range; two under zigzag: chunks r and
    2P - 1 - r of 2P). The sequence must cut into equal chunks: a multiple of ``world``
    (balanced) or of ``2 * world`` (zigzag)."""
    _check_schedule(schedule)
    _check_world(world)
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world} ranks (0..{world})")
    chunks = world if schedule == "balanced" else 2 * world
    if seq < chunks or seq % chunks:
        raise ValueError(
            f"a sequence of {seq} tokens does not cut into {chunks} equal chunks for {world} ranks under {schedule!r}; "
            f"pad or trim it to a multiple of {chunks}"
        )
    c = seq // chunks
    own = [rank] if schedule == "balanced" else [rank, 2 * world - 1 - rank]
    return [(i * c, (i + 1) * c) for i in own]


def _join_order(world, schedule):
    """(rank, part) of every chunk in sequence order: part 0 is a rank's first own chunk."""
    if schedule == "balanced":
        return [(r, 0) for r in range(world)]
    return [(r, 0) for r in range(world)] + [(r, 1) for r in reversed(range(world))]


def _take(x, dim, start, stop):
    if isinstance(x, list):
        if dim != 0:
            raise ValueError(f"a list is one-dimensional; split it along dim 0, not {dim}")
        return x[start:stop]
    return x.narrow(dim, start, stop - start)


def _cat(parts, dim):
    if isinstance(parts[0], list):
        return [e for p in parts for e in p]
    if len(parts) == 1:
        return parts[0]
    import torch

    return torch.cat(parts, dim)


def split_sequence(x, world, rank, schedule="balanced", dim=1):
    """Rank ``rank``'s chunk of the whole-sequence ``x`` (a tensor, sequence along ``dim``:
    1 for ``[batch, seq, heads, head_dim]``; or a list, along 0): :func:`chunk_spans`'s ranges
    one after the other. Balanced gives a view; zigzag a new tensor of the two ranges."""
    seq = len(x) if isinstance(x, list) else int(x.shape[dim])
    return _cat([_take(x, dim, a, b) for a, b in chunk_spans(seq, world, rank, schedule)], dim)


def join_sequence(chunks, schedule="balanced", dim=1):
    """The whole sequence from every rank's chunk (``chunks[r]`` rank r's, as
    :func:`split_sequence` made it or :func:`dist_flash_attn` returned it): the inverse of
    split_sequence over all ranks."""
    _check_schedule(schedule)
    world = len(chunks)
    _check_world(world)
    parts = 1 if schedule == "balanced" else 2
    lens = {len(c) if isinstance(c, list) else int(c.shape[dim]) for c in chunks}
    if len(lens) != 1 or next(iter(lens)) % parts:
        raise ValueError(
            f"the ranks' chunks have {sorted(lens)} tokens; joining under {schedule!r} needs equal chunks"
            + (" of an even length" if parts == 2 else "")
        )
    n = next(iter(lens)) // parts
    return _cat([_take(chunks[r], dim, p * n, (p + 1) * n) for r, p in _join_order(world, schedule)], dim)


class VirtualGroup:
    """A group of ``world`` virtual ranks on one GPU: pass it as ``group`` to
    :func:`dist_flash_attn` with lists of every rank's q, k, v chunks. ``timeout`` (seconds,
    `distflash attention`'s default) bounds how long a rank waits for another's data before
    the call fails with a sentence."""

    def __init__(self, world, timeout=600.0):
        _check_world(world)
        if not timeout > 0:
            raise ValueError(f"timeout={timeout!r}; pass a positive number of seconds")
        self.world = world
        self.timeout = float(timeout)

    def __repr__(self):
        return f"VirtualGroup({self.world})"


def _rank_shape(q, k, v, schedule, what=""):
    """One rank's checked shape (``_checks.Shape``): the kernels' checks, and an even chunk
    under zigzag."""
    shape = _checks.check_inputs(q, k, v)
    if schedule == "zigzag" and shape.seq % 2:
        raise ValueError(
            f"{what}q has {shape.seq} tokens, an odd number; under 'zigzag' a rank holds two equal halves "
            "(chunks r and 2P-1-r): cut the sequence with distflash.split_sequence"
        )
    return shape


def check_virtual(group, qs, ks, vs, schedule):
    """The checks of a virtual group's call: one chunk per rank, each valid, all of one shape
    on one GPU. Returns the shared ``_checks.Shape``."""
    _check_schedule(schedule)
    for name, ts in (("q", qs), ("k", ks), ("v", vs)):
        if not isinstance(ts, (list, tuple)):
            raise TypeError(
                f"with a VirtualGroup, {name} must be a list of every rank's chunk, got {type(ts).__name__}"
            )
        if len(ts) != group.world:
            raise ValueError(
                f"{group!r} has {group.world} ranks, but {len(ts)} {name} chunks were passed; pass one per rank"
            )
    shapes = [_rank_shape(q, k, v, schedule, f"rank {r}: ") for r, (q, k, v) in enumerate(zip(qs, ks, vs))]
    for r, s in enumerate(shapes[1:], 1):
        if s != shapes[0]:
            raise ValueError(
                f"rank {r}'s chunk is {_describe(s)} but rank 0's is {_describe(shapes[0])}; "
                "every rank holds an equal chunk of one sequence, on one GPU"
            )
    return shapes[0]


def check_rank(group, q, k, v, schedule):
    """The checks of one process's call over a torch.distributed group (None: the world)."""
    _check_schedule(schedule)
    if isinstance(q, (list, tuple)):
        raise TypeError(
            "q is a list: lists of every rank's chunk go with group=distflash.VirtualGroup(world); "
            "over a torch.distributed group each process passes its own chunk as one tensor"
        )
    return _rank_shape(q, k, v, schedule)


def _describe(s):
    return f"[batch {s.batch}, {s.seq} tokens, {s.heads}/{s.kv_heads} heads, head dim {s.head_dim}] {s.dtype} on cuda:{s.device}"


def _local_parts(shape, schedule):
    """The rank's own chunks as token ranges of its tensor: all of it, or its two halves."""
    n = shape.seq
    return [(0, n)] if schedule == "balanced" else [(0, n // 2), (n // 2, n)]


def _functions():
    """The two autograd functions, built on first use (they subclass torch.autograd.Function)."""
    if _FUNCTIONS:
        return _FUNCTIONS
    import torch

    from . import _distflash
    from .attention import _stream

    def head_major(t, parts):
        return [t[:, a:b].transpose(1, 2).contiguous() for a, b in parts]

    def seq_major(chunks, dtype):
        return torch.cat([c.transpose(1, 2) for c in chunks], 1).to(dtype)

    class Rank:
        """One rank's tensors of a call: the forward's inputs and results, the backward's."""

        def __init__(self, q, k, v, shape, schedule):
            parts = _local_parts(shape, schedule)
            self.qh, self.kh, self.vh = (head_major(t, parts) for t in (q, k, v))
            self.parts, self.shape = parts, shape

        def forward_chunks(self):
            self.out = [torch.empty(q.shape, dtype=torch.float32, device=q.device) for q in self.qh]
            self.lse = [torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) for q in self.qh]
            return [
                tuple(t.data_ptr() for t in ts)
                for ts in zip(self.qh, self.kh, self.vh, self.out, self.lse)
            ]

        def output(self, dtype):
            out = seq_major(self.out, dtype)
            self.out = [o.to(dtype) for o in self.out]  # what the backward's D reads, as flash_attn
            return out

        def lse_rows(self):
            """LSE of the rank's rows, ``[batch, heads, seq_chunk]`` in the order of its output
            (under zigzag its two parts one after the other): a copy, the backward keeps its own."""
            return torch.cat(self.lse, 2)

        def backward_chunks(self, dout):
            self.dout = head_major(dout.to(self.qh[0].dtype), self.parts)
            f32 = lambda t: torch.empty(t.shape, dtype=torch.float32, device=t.device)  # noqa: E731
            self.dq, self.dk, self.dv = ([f32(t) for t in ts] for ts in (self.qh, self.kh, self.vh))
            return [
                tuple(t.data_ptr() for t in ts)
                for ts in zip(self.qh, self.kh, self.vh, self.out, self.lse, self.dout, self.dq, self.dk, self.dv)
            ]

        def grads(self, dtype):
            """dq, dk, dv shaped as the rank's q, k, v; the backward's scratch let go (the
            forward's tensors stay, for a backward with retain_graph)."""
            grads = tuple(seq_major(g, dtype) for g in (self.dq, self.dk, self.dv))
            self.dout = self.dq = self.dk = self.dv = None
            return grads

    def mask_tuple(m):
        """The Rust side's (document lengths, window, global tokens) of a ``_checks.Mask``."""
        return (list(m.doc_lens), m.window, m.global_tokens)

    def shape_tuple(s):
        """The Rust side's (batch, rows, heads, kv_heads, head_dim) of the rank's chunk."""
        return (s.batch, s.seq, s.heads, s.kv_heads, s.head_dim)

    class Virtual(torch.autograd.Function):
        """Every rank of a VirtualGroup: inputs q_0..q_{P-1}, k_0.., v_0..; outputs o_0..o_{P-1}
        and then every rank's LSE (not differentiable)."""

        @staticmethod
        def forward(ctx, group, schedule, shape, mask, *qkv):
            p = group.world
            ranks = [Rank(qkv[r], qkv[p + r], qkv[2 * p + r], shape, schedule) for r in range(p)]
            dev = qkv[0].device
            with torch.cuda.device(dev):
                _distflash.virtual_pass(
                    "forward", shape.device, shape.dtype, _stream(torch, dev), p, schedule, shape_tuple(shape),
                    [r.forward_chunks() for r in ranks], group.timeout, mask_tuple(mask),
                )
                outs = tuple(r.output(qkv[0].dtype) for r in ranks)
                lses = tuple(r.lse_rows() for r in ranks)
            ctx.ranks, ctx.group, ctx.schedule, ctx.shape, ctx.mask = ranks, group, schedule, shape, mask
            ctx.mark_non_differentiable(*lses)
            return outs + lses

        @staticmethod
        def backward(ctx, *grads_out):
            ranks, group, shape = ctx.ranks, ctx.group, ctx.shape
            douts = grads_out[: len(ranks)]
            dev = ranks[0].qh[0].device
            dtype = ranks[0].qh[0].dtype
            with torch.cuda.device(dev):
                _distflash.virtual_pass(
                    "backward", shape.device, shape.dtype, _stream(torch, dev), group.world, ctx.schedule, shape_tuple(shape),
                    [r.backward_chunks(d) for r, d in zip(ranks, douts)], group.timeout, mask_tuple(ctx.mask),
                )
                grads = [r.grads(dtype) for r in ranks]
            return (None, None, None, None, *(g[0] for g in grads), *(g[1] for g in grads), *(g[2] for g in grads))

    class Process(torch.autograd.Function):
        """This process's rank of a torch.distributed group, over distflash's NCCL communicator:
        its output and its LSE (not differentiable)."""

        @staticmethod
        def forward(ctx, nccl, schedule, shape, mask, q, k, v):
            rank = Rank(q, k, v, shape, schedule)
            with torch.cuda.device(q.device):
                nccl.run("forward", schedule, shape_tuple(shape), rank.forward_chunks(), mask_tuple(mask))
                out = rank.output(q.dtype)
                lse = rank.lse_rows()
            ctx.rank, ctx.nccl, ctx.schedule, ctx.shape, ctx.mask = rank, nccl, schedule, shape, mask
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            rank = ctx.rank
            dtype = rank.qh[0].dtype
            with torch.cuda.device(rank.qh[0].device):
                ctx.nccl.run(
                    "backward", ctx.schedule, shape_tuple(ctx.shape), rank.backward_chunks(dout), mask_tuple(ctx.mask)
                )
                grads = rank.grads(dtype)
            return (None, None, None, None, *grads)

    _FUNCTIONS.update(virtual=Virtual, process=Process)
    return _FUNCTIONS


def _nccl_group(group, shape, schedule, device, mask_args):
    """distflash's NCCL communicator for ``group`` on this device, dtype and torch stream
    (built collectively on first use), after checking that every rank calls alike, and the
    call's mask over the whole sequence (``mask_args``: ``check_mask``'s keyword arguments)."""
    import torch
    import torch.distributed as dist

    from . import _distflash
    from .attention import _stream

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "dist_flash_attn over a process group needs torch.distributed.init_process_group first "
            "(e.g. under torchrun); on one GPU pass group=distflash.VirtualGroup(world)"
        )
    pg = group if group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(pg), dist.get_rank(pg)
    if rank < 0:
        raise ValueError("this process is not a member of the group it passed; pass a group it belongs to")
    mask = _checks.check_mask(shape.seq * world, **mask_args)
    on = "cpu" if dist.get_backend(pg) == "gloo" else device  # where the group's collectives run
    mine = torch.tensor(
        [shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim, SCHEDULES.index(schedule),
         list(_checks.DTYPES.values()).index(shape.dtype), _mask_digest(mask)],
        dtype=torch.int64, device=on,
    )
    every = torch.empty(world * mine.numel(), dtype=torch.int64, device=on)
    dist.all_gather_into_tensor(every, mine, group=pg)
    rows = every.view(world, -1).tolist()
    for r, row in enumerate(rows):
        if row != rows[0]:
            raise ValueError(
                f"ranks disagree: rank {r} calls with (batch, tokens, heads, kv heads, head dim, schedule, dtype, mask digest) = "
                f"{tuple(row)}, rank 0 with {tuple(rows[0])} (schedule {SCHEDULES}, dtype {tuple(_checks.DTYPES.values())} by index); "
                "every rank passes an equal chunk of one sequence under one schedule"
            )
    stream = _stream(torch, device)
    key = (pg, shape.device, shape.dtype, stream)
    if key not in _NCCL_GROUPS:
        box = [_distflash.nccl_unique_id() if rank == 0 else None]
        with torch.cuda.device(device):  # where NCCL's broadcast stages the pickled id
            dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0), group=pg)
        _NCCL_GROUPS[key] = _distflash.nccl_group(shape.device, shape.dtype, stream, rank, world, bytes(box[0]))
    return _NCCL_GROUPS[key], mask


def _mask_digest(mask):
    """A number every rank computes alike from the mask (CRC-32 of its fields), so ranks that
    pass different masks are told apart before any transfer."""
    return zlib.crc32(repr(tuple(mask)).encode())


def dist_flash_attn(
    q, k, v, group=None, schedule="balanced", return_lse=False,
    *, doc_lens=None, cu_seqlens=None, window=None, global_tokens=0,
):
    """Causal attention of a sequence split across the ranks of ``group``; each rank passes its
    chunk (any strides: it is copied): CUDA bf16/fp16 ``[batch, seq_chunk, heads, head_dim]`` q and
    ``[batch, seq_chunk, kv_heads, head_dim]`` k, v (GQA/MQA; the head dims of ``flash_attn``),
    as :func:`split_sequence` cuts them. Returns this rank's output, shaped as q, in its dtype;
    differentiable in q, k and v. With ``return_lse=True`` also its LSE ``[batch, heads,
    seq_chunk]`` (float32, natural log, the rows in the output's order; :func:`join_sequence`
    with ``dim=2`` puts the ranks' back together).

    ``group``: a ``torch.distributed`` process group (None: the default group), one GPU per
    process, over NCCL; or a :class:`VirtualGroup` on one GPU, and then q, k and v are lists of
    every rank's chunk and the result the list of every rank's output. ``schedule``:
    ``"balanced"`` or ``"zigzag"`` (module docs). Every rank must pass an equal chunk; wrong
    arguments are a ValueError or TypeError naming the fix.

    Masks, as ``flash_attn`` takes them, over the *whole* sequence (every rank passes the same):
    ``doc_lens`` or ``cu_seqlens`` (packed documents, which may cross the ranks' chunks),
    ``window`` and ``global_tokens``. Blocks the mask hides wholly are neither computed nor
    fetched.
    """
    mask_args = dict(doc_lens=doc_lens, cu_seqlens=cu_seqlens, window=window, global_tokens=global_tokens)
    if isinstance(group, VirtualGroup):
        shape = check_virtual(group, q, k, v, schedule)
        mask = _checks.check_mask(shape.seq * group.world, **mask_args)
        results = _functions()["virtual"].apply(group, schedule, shape, mask, *q, *k, *v)
        outs, lses = list(results[: group.world]), list(results[group.world:])
        return (outs, lses) if return_lse else outs
    shape = check_rank(group, q, k, v, schedule)
    nccl, mask = _nccl_group(group, shape, schedule, q.device, mask_args)
    out, lse = _functions()["process"].apply(nccl, schedule, shape, mask, q, k, v)
    return (out, lse) if return_lse else out

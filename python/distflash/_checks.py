"""The argument checks of ``distflash.flash_attn``, in plain Python.

They read only what any tensor answers (``device``, ``dtype``, ``shape``, ``dim()``), so they
run, and are tested, without torch or a GPU (strides are the autograd glue's: any are taken,
``attention._readable``); a wrong argument is
refused here with a sentence naming it and the fix, before anything reaches the kernels. The
Rust side checks the shape and every address again (``ValueError`` as well), so a caller that
skips this layer still gets a sentence, never a crash.
"""

import math
from typing import NamedTuple

# torch's dtype names (``str(torch.bfloat16)``) and the name the Rust side takes.
DTYPES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16"}

# The head dims the CUDA kernels are instantiated for (``distflash::backend::cuda::HEAD_DIMS``;
# the extension module's ``HEAD_DIMS`` says the same, and a test checks they agree).
HEAD_DIMS = (64, 80, 96, 128, 192, 256)

# How far ``softmax_scale`` may be from 1/sqrt(head_dim), relatively, to count as it: the
# kernels take no other scale, and two spellings of that one (``head_dim ** -0.5``,
# ``1 / math.sqrt(head_dim)``) differ by an f64 rounding or two.
SCALE_RTOL = 1e-6


class Mask(NamedTuple):
    """Which keys each query sees beyond causality, as the Rust side's ``Mask::new`` takes it:
    packed documents (``doc_lens``; empty for one), a causal sliding window (``None``: none) and
    global prefix tokens every later token sees."""

    doc_lens: tuple = ()
    window: object = None
    global_tokens: int = 0


def _whole(x, name):
    """``x`` as an int, if it is a whole number (an int, a whole float, a 0-d integer tensor)."""
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or int(x) != x:
        raise TypeError(f"{name} must be a whole number, got {x!r}")
    return int(x)


def _as_ints(values, name):
    """A list of ints from a list, tuple or 1-D integer tensor (``.tolist()``)."""
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    return [_whole(n, f"every entry of {name}") for n in values]


def check_mask(seq, doc_lens=None, window=None, global_tokens=0, cu_seqlens=None):
    """Checks the mask arguments of ``flash_attn`` against the sequence length and returns the
    :class:`Mask`. Documents come as lengths (``doc_lens``) or as ``cu_seqlens`` offsets
    ``[0, l0, l0 + l1, ..., seq]`` (FlashAttention's varlen spelling), not both; they apply to
    every sequence of the batch."""
    if cu_seqlens is not None:
        if doc_lens is not None:
            raise ValueError("pass doc_lens or cu_seqlens, not both: they say the same thing")
        offsets = _as_ints(cu_seqlens, "cu_seqlens")
        if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != seq:
            raise ValueError(
                f"cu_seqlens must run from 0 to the sequence length {seq}, got {offsets}"
            )
        doc_lens = [b - a for a, b in zip(offsets, offsets[1:])]
    docs = () if doc_lens is None else tuple(_as_ints(doc_lens, "doc_lens"))
    for i, n in enumerate(docs):
        if n <= 0:
            raise ValueError(f"document {i} has length {n}: every document needs at least one token")
    if docs and sum(docs) != seq:
        raise ValueError(
            f"the {len(docs)} document lengths add up to {sum(docs)} tokens but the sequence has {seq}: make them sum to the sequence length"
        )
    if window is not None:
        window = _whole(window, "window")
        if window < 1:
            raise ValueError(f"window={window} hides every key: pass 1 or more (a token sees itself), or None")
    global_tokens = _whole(global_tokens, "global_tokens")
    if global_tokens < 0:
        raise ValueError(f"global_tokens={global_tokens}: pass a count of 0 or more")
    if global_tokens > seq:
        raise ValueError(f"{global_tokens} global tokens do not fit a sequence of {seq}: pass {seq} or fewer")
    return Mask(docs, window, global_tokens)


class Shape(NamedTuple):
    """What the kernels are told about one call."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    device: int


def _torch_sees_a_gpu():
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Whether this machine has a GPU for the kernels: it decides what a tensor off the GPU is told
# (a function, so that tests can stand in for either machine).
gpu_present = _torch_sees_a_gpu


def _is_tensor(t):
    return all(hasattr(t, a) for a in ("device", "dtype", "shape", "dim"))


def _check_one(t, name):
    if not _is_tensor(t):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cuda" and not gpu_present():
        raise ValueError(
            f"{name} is on {t.device.type}, and torch sees no CUDA GPU here: distflash's kernels need an NVIDIA GPU; on this machine use torch.nn.functional.scaled_dot_product_attention, or the CPU reference of the distflash command line (distflash attention --check)"
        )
    if t.device.type != "cuda":
        raise ValueError(
            f"{name} is on {t.device.type}; distflash's kernels run on CUDA tensors: move it with .cuda()"
        )
    if str(t.dtype) not in DTYPES:
        raise TypeError(
            f"{name} is {t.dtype}; distflash's kernels take torch.bfloat16 or torch.float16 tensors: convert with .to(torch.bfloat16)"
        )
    if t.dim() != 4:
        raise ValueError(
            f"{name} has {t.dim()} dimensions {tuple(t.shape)}; flash_attn takes [batch, seq, heads, head_dim] tensors"
        )


def check_inputs(q, k, v, causal=True, softmax_scale=None, head_major=False):
    """Checks q, k, v for the kernels and returns their :class:`Shape`.

    ``head_major=False``: ``[batch, seq, heads, head_dim]`` tensors, as ``flash_attn`` and
    ``dist_flash_attn`` take them. ``head_major=True``: ``[batch, heads, seq, head_dim]``, as
    transformers' attention interface hands them over. Any strides.
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_one(t, name)
    if causal is not True:
        raise ValueError(
            f"causal={causal!r} is not supported: distflash's kernels compute causal attention only"
        )
    if q.device != k.device or q.device != v.device:
        raise ValueError(
            f"q, k and v must be on one GPU, got {q.device}, {k.device} and {v.device}"
        )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(
            f"q, k and v must have one dtype, got {q.dtype}, {k.dtype} and {v.dtype}"
        )

    def bshd(t):
        b, x, y, d = (int(n) for n in t.shape)
        return (b, y, x, d) if head_major else (b, x, y, d)

    (b, s, h, d), (kb, ks, kh, kd) = bshd(q), bshd(k)
    layout = "[batch, heads, seq, head_dim]" if head_major else "[batch, seq, heads, head_dim]"
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(
            f"k and v must have one shape, got {tuple(k.shape)} and {tuple(v.shape)} ({layout})"
        )
    if kb != b:
        raise ValueError(f"q has batch {b} but k and v have batch {kb}")
    if ks != s:
        raise ValueError(
            f"q has {s} tokens but k and v have {ks}; distflash's causal attention takes one sequence length for all three"
        )
    if kd != d:
        raise ValueError(f"q has head dim {d} but k and v have head dim {kd}")
    if d not in HEAD_DIMS:
        raise ValueError(
            f"head dim {d} is not supported: distflash's CUDA kernels take head dim {', '.join(map(str, HEAD_DIMS[:-1]))} or {HEAD_DIMS[-1]}"
        )
    if kh == 0 or h % kh != 0:
        raise ValueError(
            f"q has {h} heads and k, v have {kh}: the kv heads must divide the query heads (GQA/MQA)"
        )
    if b == 0 or s == 0:
        raise ValueError(f"q has shape {tuple(q.shape)}: pass at least one sequence of one token")
    if softmax_scale is not None:
        default = 1.0 / math.sqrt(d)
        if not math.isclose(float(softmax_scale), default, rel_tol=SCALE_RTOL):
            raise ValueError(
                f"softmax_scale={softmax_scale} is not supported: distflash's kernels scale by 1/sqrt(head_dim) = {default:.6g}; pass None"
            )
    index = q.device.index
    return Shape(b, s, h, kh, d, DTYPES[str(q.dtype)], 0 if index is None else int(index))

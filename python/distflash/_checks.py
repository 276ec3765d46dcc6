"""The argument checks of ``distflash.flash_attn``, in plain Python.

They read only what any tensor answers (``device``, ``dtype``, ``shape``, ``dim()``,
``is_contiguous()``), so they run, and are tested, without torch or a GPU; a wrong argument is
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


class Shape(NamedTuple):
    """What the kernels are told about one call."""

    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    device: int


def _is_tensor(t):
    return all(hasattr(t, a) for a in ("device", "dtype", "shape", "dim", "is_contiguous"))


def _check_one(t, name, contiguous):
    if not _is_tensor(t):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous; pass {name}.contiguous()")


def check_inputs(q, k, v, causal=True, softmax_scale=None, head_major=False, contiguous=True):
    """Checks q, k, v for the kernels and returns their :class:`Shape`.

    ``head_major=False``: contiguous ``[batch, seq, heads, head_dim]`` tensors, as
    ``flash_attn`` takes them (any strides with ``contiguous=False``: ``dist_flash_attn``
    copies every chunk anyway). ``head_major=True``: ``[batch, heads, seq, head_dim]`` in any
    strides, as transformers' attention interface hands them over (they are made contiguous
    after the check).
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_one(t, name, contiguous=contiguous and not head_major)
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

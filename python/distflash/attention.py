"""``flash_attn``: distflash's whole-sequence causal CUDA attention as a torch autograd function.

The kernels read and write head-major tensors (``[batch, heads, seq, head_dim]``), so
``flash_attn`` transposes torch's ``[batch, seq, heads, head_dim]`` with torch (on its stream,
in its memory, tracked by autograd) and calls :class:`_HeadMajor`, which hands the tensors'
addresses and ``torch.cuda.current_stream().cuda_stream`` to the Rust extension: the kernels
run on torch's stream and memory, in the device's primary context (torch's own), and every
output is allocated here by ``torch.empty``. The backward's gradients come out of the kernels
in float32 and are rounded to the input dtype by torch.

torch is imported on first use, so ``import distflash`` works on a machine without it.
"""

from . import _checks

_FUNCTION = None


def _stream(torch, device):
    return torch.cuda.current_stream(device).cuda_stream


def _head_major_function():
    """The autograd function, built on first use (it subclasses ``torch.autograd.Function``)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    from . import _distflash

    class _HeadMajor(torch.autograd.Function):
        """Causal attention of contiguous head-major q ``[b, h, s, d]``, k, v ``[b, hk, s, d]``
        under ``mask`` (a :class:`distflash._checks.Mask`); returns O ``[b, h, s, d]`` (input dtype) and LSE ``[b, h, s]`` (float32, natural log,
        not differentiable)."""

        @staticmethod
        def forward(ctx, q, k, v, shape, mask):
            out = torch.empty_like(q)
            lse = torch.empty((shape.batch, shape.heads, shape.seq), dtype=torch.float32, device=q.device)
            with torch.cuda.device(q.device):
                _distflash.forward(
                    shape.device, shape.dtype, _stream(torch, q.device),
                    shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim,
                    q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                    list(mask.doc_lens), mask.window, mask.global_tokens,
                )
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.shape = shape
            ctx.mask = mask
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            shape, mask = ctx.shape, ctx.mask
            dout = dout.to(q.dtype).contiguous()
            dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
            dk = torch.empty(k.shape, dtype=torch.float32, device=q.device)
            dv = torch.empty(v.shape, dtype=torch.float32, device=q.device)
            with torch.cuda.device(q.device):
                _distflash.backward(
                    shape.device, shape.dtype, _stream(torch, q.device),
                    shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim,
                    q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                    dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                    list(mask.doc_lens), mask.window, mask.global_tokens,
                )
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None

    _FUNCTION = _HeadMajor
    return _FUNCTION


def attend_head_major(q, k, v, softmax_scale=None, *, doc_lens=None, cu_seqlens=None, window=None, global_tokens=0):
    """Causal attention of ``[batch, heads, seq, head_dim]`` q, k, v in any strides (as
    transformers hands them over); returns O ``[batch, heads, seq, head_dim]`` and LSE
    ``[batch, heads, seq]``. Made contiguous first (a copy only where they are not). The mask
    arguments are :func:`flash_attn`'s, checked the same way."""
    shape = _checks.check_inputs(q, k, v, True, softmax_scale, head_major=True)
    mask = _checks.check_mask(shape.seq, doc_lens, window, global_tokens, cu_seqlens)
    return _head_major_function().apply(q.contiguous(), k.contiguous(), v.contiguous(), shape, mask)


def flash_attn(
    q, k, v, causal=True, softmax_scale=None, return_lse=False,
    *, doc_lens=None, cu_seqlens=None, window=None, global_tokens=0,
):
    """Causal attention of contiguous CUDA bf16/fp16 ``[batch, seq, heads, head_dim]`` q and
    ``[batch, seq, kv_heads, head_dim]`` k, v (kv heads dividing heads: GQA, MQA), differentiable
    in q, k and v. Returns O ``[batch, seq, heads, head_dim]`` in the input dtype, and with
    ``return_lse=True`` also LSE ``[batch, heads, seq]`` (float32, natural log).

    ``causal`` must be True and ``softmax_scale`` None or 1/sqrt(head_dim): the kernels compute
    nothing else, and anything else is refused with a ValueError, as is a CPU tensor, a
    non-contiguous one, a head dim the kernels do not take (``HEAD_DIMS``) or mismatched shapes (a float32 tensor:
    TypeError).

    Masks (the same for every sequence of the batch): ``doc_lens`` packs documents of those
    lengths into the sequence (or ``cu_seqlens``, their offsets ``[0, l0, l0 + l1, ..., seq]``;
    a list, tuple or integer tensor) and a token sees only its own document; ``window=W`` is a
    causal sliding window (a token sees itself and the W - 1 before it, as Mistral's
    ``sliding_window``); ``global_tokens=G`` lets every later token see the first G. Tiles the
    mask hides wholly are skipped, so packed documents cost what their pairs cost.
    """
    shape = _checks.check_inputs(q, k, v, causal, softmax_scale)
    mask = _checks.check_mask(shape.seq, doc_lens, window, global_tokens, cu_seqlens)
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    out, lse = _head_major_function().apply(qh, kh, vh, shape, mask)
    out = out.transpose(1, 2).contiguous()
    return (out, lse) if return_lse else out

"""``flash_attn``: distflash's whole-sequence causal CUDA attention as a torch autograd function.

The kernels read and write tensors in place under their strides (the head dim contiguous, the
batch, head and sequence strides in whole 16-byte vectors), so torch's ``[batch, seq, heads,
head_dim]`` tensors and transformers' transposed ``[batch, heads, seq, head_dim]`` views go in
without a copy: :class:`_Attention` hands their addresses, their strides and
``torch.cuda.current_stream().cuda_stream`` to the Rust extension, so the kernels run on
torch's stream and memory, in the device's primary context (torch's own). Every output is
allocated here by ``torch.empty_strided`` in its input's strides (O and dQ as q, dK and dV as
k). dQ comes out of the kernels in float32 and is rounded to the input dtype by torch; dK and
dV too under GQA, while with one query head per KV head the kernel writes them in the input
dtype itself (the extension's ``kv_grads_in_input_dtype``).

torch is imported on first use, so ``import distflash`` works on a machine without it.
"""

from . import _checks

_FUNCTION = None


def _stream(torch, device):
    return torch.cuda.current_stream(device).cuda_stream


def _strides(t, head_major):
    """The (batch, head, seq) element strides of a ``[b, s, h, d]`` tensor (``[b, h, s, d]``
    with ``head_major``), in the order the extension takes them."""
    sb, s1, s2, _ = t.stride()
    return [sb, s1, s2] if head_major else [sb, s2, s1]


def _readable(t):
    """``t`` itself where the kernels take it in place (head dim contiguous, the other strides
    of its dimensions longer than one in whole 16-byte vectors, the start 16-byte aligned, and
    no two elements at one address, since its gradient is written in its strides), else a
    contiguous copy."""
    strides, shape = t.stride(), t.shape
    outer = sorted((s, n) for s, n in zip(strides[:-1], shape[:-1]) if n > 1)
    ok = strides[-1] == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s, _ in outer)
    reach = shape[-1]
    for s, n in outer:
        ok = ok and s >= reach
        reach += s * (n - 1)
    return t if ok else t.contiguous()


def _kv_pair(k, v):
    """k and v in one set of strides (the kernels take one for both): as they are, or both
    contiguous."""
    k, v = _readable(k), _readable(v)
    if k.stride() != v.stride():
        k, v = k.contiguous(), v.contiguous()
    return k, v


def _attention_function():
    """The autograd function, built on first use (it subclasses ``torch.autograd.Function``)."""
    global _FUNCTION
    if _FUNCTION is not None:
        return _FUNCTION
    import torch

    from . import _distflash

    class _Attention(torch.autograd.Function):
        """Causal attention of q ``[b, s, h, d]``, k, v ``[b, s, hk, d]`` (or, with
        ``head_major``, ``[b, h, s, d]`` and ``[b, hk, s, d]``) in strides the kernels read
        (:func:`_readable`; k and v in one) under ``mask`` (a :class:`distflash._checks.Mask`);
        returns O in q's shape and strides (input dtype) and LSE ``[b, h, s]`` (float32, natural
        log, not differentiable)."""

        @staticmethod
        def forward(ctx, q, k, v, shape, mask, head_major):
            out = torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device)
            lse = torch.empty((shape.batch, shape.heads, shape.seq), dtype=torch.float32, device=q.device)
            with torch.cuda.device(q.device):
                _distflash.forward(
                    shape.device, shape.dtype, _stream(torch, q.device),
                    shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim,
                    q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                    _strides(q, head_major), _strides(k, head_major),
                    list(mask.doc_lens), mask.window, mask.global_tokens,
                )
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.shape, ctx.mask, ctx.head_major = shape, mask, head_major
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            shape, mask, head_major = ctx.shape, ctx.mask, ctx.head_major
            if dout.dtype != q.dtype or dout.stride() != q.stride():
                # The kernels read dO in O's (q's) strides.
                dout = torch.empty_strided(q.shape, q.stride(), dtype=q.dtype, device=q.device).copy_(dout)
            kv_dtype = q.dtype if _distflash.kv_grads_in_input_dtype(
                shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim
            ) else torch.float32
            dq = torch.empty_strided(q.shape, q.stride(), dtype=torch.float32, device=q.device)
            dk, dv = (torch.empty_strided(k.shape, k.stride(), dtype=kv_dtype, device=q.device) for _ in "kv")
            with torch.cuda.device(q.device):
                _distflash.backward(
                    shape.device, shape.dtype, _stream(torch, q.device),
                    shape.batch, shape.seq, shape.heads, shape.kv_heads, shape.head_dim,
                    q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                    dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                    _strides(q, head_major), _strides(k, head_major),
                    list(mask.doc_lens), mask.window, mask.global_tokens,
                )
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None

    _FUNCTION = _Attention
    return _FUNCTION


def attend_head_major(q, k, v, softmax_scale=None, *, doc_lens=None, cu_seqlens=None, window=None, global_tokens=0):
    """Causal attention of ``[batch, heads, seq, head_dim]`` q, k, v in any strides (as
    transformers hands them over: its transposed views are read in place); returns O
    ``[batch, heads, seq, head_dim]`` (in q's strides) and LSE ``[batch, heads, seq]``. The
    mask arguments are :func:`flash_attn`'s, checked the same way."""
    shape = _checks.check_inputs(q, k, v, True, softmax_scale, head_major=True)
    mask = _checks.check_mask(shape.seq, doc_lens, window, global_tokens, cu_seqlens)
    k, v = _kv_pair(k, v)
    return _attention_function().apply(_readable(q), k, v, shape, mask, True)


def flash_attn(
    q, k, v, causal=True, softmax_scale=None, return_lse=False,
    *, doc_lens=None, cu_seqlens=None, window=None, global_tokens=0,
):
    """Causal attention of CUDA bf16/fp16 ``[batch, seq, heads, head_dim]`` q and ``[batch,
    seq, kv_heads, head_dim]`` k, v (kv heads dividing heads: GQA, MQA), differentiable in q, k
    and v. Returns O ``[batch, seq, heads, head_dim]`` in the input dtype and q's strides, and
    with ``return_lse=True`` also LSE ``[batch, heads, seq]`` (float32, natural log).

    Any strides with the head dim contiguous are read in place (contiguous tensors, slices of a
    fused QKV projection); others are copied once. ``causal`` must be True and
    ``softmax_scale`` None or 1/sqrt(head_dim): the kernels compute nothing else, and anything
    else is refused with a ValueError, as is a CPU tensor, a head dim the kernels do not take
    (``HEAD_DIMS``) or mismatched shapes (a float32 tensor: TypeError).

    Masks (the same for every sequence of the batch): ``doc_lens`` packs documents of those
    lengths into the sequence (or ``cu_seqlens``, their offsets ``[0, l0, l0 + l1, ..., seq]``;
    a list, tuple or integer tensor) and a token sees only its own document; ``window=W`` is a
    causal sliding window (a token sees itself and the W - 1 before it, as Mistral's
    ``sliding_window``); ``global_tokens=G`` lets every later token see the first G. Tiles the
    mask hides wholly are skipped, so packed documents cost what their pairs cost.
    """
    shape = _checks.check_inputs(q, k, v, causal, softmax_scale)
    mask = _checks.check_mask(shape.seq, doc_lens, window, global_tokens, cu_seqlens)
    k, v = _kv_pair(k, v)
    out, lse = _attention_function().apply(_readable(q), k, v, shape, mask, False)
    return (out, lse) if return_lse else out

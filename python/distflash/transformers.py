"""distflash as a transformers attention implementation.

``register()`` once, then ``AutoModelForCausalLM.from_pretrained(..., attn_implementation="distattn")``
runs every attention layer through :func:`distflash.attention.attend_head_major`.

Masks, as transformers' flash-attention path takes them (the registered mask builder,
:func:`mask_builder`, hands over no dense mask; the attention reads its keyword arguments;
:mod:`distflash._hf_masks` says exactly how):

- causal attention, and Mistral's (Qwen2's, ...) ``sliding_window`` W: a token sees itself and
  the W - 1 before it, as transformers masks it;
- packed documents, several in one row (``DataCollatorWithFlattening``), from ``position_ids``
  that restart (at 0) at every document or from the ``cu_seq_lens_q``/``cu_seq_lens_k``
  offsets; the same packing for every row of the batch;
- both together.

Refused with a ValueError naming the fix, never ignored: a padding mask (zeros in
``attention_mask``), a ready-made 4-D mask, rows packed differently, a model that adds mask
functions of its own (``or_mask_function``/``and_mask_function``, tokens seeing later ones such
as multimodal models' image blocks, Llama 4's chunked attention), dropout, non-causal layers,
logit soft-capping and attention sinks. Decoding with a KV cache (fewer queries than keys) goes
to transformers' SDPA attention, which computes it exactly under the dense mask the builder
then makes with transformers' own ``sdpa_mask``.

The name is ``distattn``, not ``distflash``: transformers takes any implementation whose name
contains "flash" for a FlashAttention build (``is_flash_attention_requested`` is a substring
test) and then tries to import the flash-attn kernels for it, or swaps in a model's
"compatible" flash implementation; so such names are refused.
"""

from . import _hf_masks

NAME = "distattn"

# Keyword arguments some models pass that change the attention's arithmetic, which distflash's
# kernels do not compute: Gemma 2's logit soft-capping and gpt-oss's attention sinks.
_UNSUPPORTED = {"softcap": "logit soft-capping", "s_aux": "attention sinks"}


def attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
    sliding_window=None, position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None, **kwargs,
):
    """transformers' attention signature: query ``[batch, heads, seq, head_dim]``, key and value
    ``[batch, kv_heads, seq, head_dim]``; returns ``(output [batch, seq, heads, head_dim], None)``.
    The mask comes from ``sliding_window``, ``position_ids`` and ``cu_seq_lens_q``/``_k`` (see
    :mod:`distflash._hf_masks`), never from ``attention_mask``, which must be None. Fewer
    queries than keys (decoding with a cache) go to transformers' SDPA attention, with the dense
    mask :func:`mask_builder` made for them."""
    if query.shape[2] != key.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal,
            sliding_window=sliding_window, position_ids=position_ids, **kwargs,
        )
    if attention_mask is not None:
        raise ValueError(
            "distflash attention got a dense attention mask (a padding mask with zeros, or a ready-made 4-D mask); "
            "it reads sliding windows and packed documents from transformers' position_ids, cu_seq_lens_q/k and "
            "sliding_window: pass unpadded rows without an attention_mask (pack them with DataCollatorWithFlattening), "
            "or use attn_implementation=\"sdpa\""
        )
    if dropout:
        raise ValueError(
            f"distflash attention has no dropout, and this layer asks for {dropout}; set the config's attention_dropout to 0"
        )
    if is_causal is False or (is_causal is None and getattr(module, "is_causal", True) is False):
        raise ValueError("distflash attention is causal only; this layer is not causal: use attn_implementation=\"sdpa\"")
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"this layer asks for {what} ({name}=...), which distflash's kernels do not compute: use attn_implementation=\"sdpa\""
            )
    masks = _hf_masks.mask_arguments(
        int(query.shape[0]), int(query.shape[2]), sliding_window, position_ids, cu_seq_lens_q, cu_seq_lens_k
    )
    from .attention import attend_head_major

    out, _lse = attend_head_major(query, key, value, softmax_scale=scaling, **masks)
    return out.transpose(1, 2).contiguous(), None


def _sees_later_tokens(mask_function, batch, seq, device):
    """Whether ``mask_function`` (transformers' ``(batch, head, q, kv)`` predicate) lets some
    token see the next one: checked on the diagonal above the main one (O(batch x seq)), which
    causal attention and every narrowing of it (windows, documents, padding) hide wholly, and
    which an overlay opening later tokens (``block_sequence_ids``' bidirectional blocks) shows."""
    if mask_function is None or seq < 2:
        return False
    import torch

    rows = torch.arange(batch, device=device)[:, None]
    q = torch.arange(seq - 1, device=device)[None, :]
    head = torch.zeros((), dtype=torch.long, device=device)
    return bool(mask_function(rows, head, q, q + 1).any())


def mask_builder(
    batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
    use_vmap=False, config=None, device="cpu", **kwargs,
):
    """The mask builder registered beside :func:`attention_forward` (transformers'
    ``AttentionMaskInterface``; called once per forward with ``sdpa_mask``'s arguments).

    Whole sequences (as many queries as keys, no cache offset): None, as transformers'
    ``flash_attention_mask`` returns for them, since the attention reads window and packing
    from its keyword arguments; a 2-D padding mask with zeros is handed on for the attention to
    refuse, and what the keyword arguments cannot say (mask functions a model adds) is refused
    here. Fewer queries than keys (decoding with a cache): transformers' ``sdpa_mask``, exact
    for the SDPA attention those calls go to."""
    if q_length != kv_length or bool(q_offset != 0) or bool(kv_offset != 0):
        from transformers.masking_utils import sdpa_mask

        if mask_function is not None:
            kwargs["mask_function"] = mask_function
        return sdpa_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
            attention_mask=attention_mask, use_vmap=use_vmap, config=config, device=device, **kwargs,
        )
    if use_vmap:
        raise ValueError(
            "this model adds mask functions of its own to causal attention (or_mask_function / and_mask_function); "
            "distflash attention computes causal attention, sliding windows and packed documents only: use attn_implementation=\"sdpa\""
        )
    if getattr(config, "attention_chunk_size", None):
        raise ValueError(
            f"this model uses chunked attention (attention_chunk_size={config.attention_chunk_size}), which distflash "
            "attention does not compute: use attn_implementation=\"sdpa\""
        )
    if _sees_later_tokens(mask_function, batch_size, q_length, device):
        raise ValueError(
            "this model's mask lets tokens see later ones (bidirectional blocks, such as a multimodal model's image tokens); "
            "distflash attention is causal only: use attn_implementation=\"sdpa\""
        )
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return attention_mask


def register(name=NAME):
    """Registers ``attention_forward`` and ``mask_builder`` under ``name`` with transformers'
    ``AttentionInterface`` and ``AttentionMaskInterface``; returns the name to pass as
    ``attn_implementation``."""
    if "flash" in name:
        raise ValueError(
            f"the name {name!r} contains \"flash\", which transformers takes for a FlashAttention build "
            f"(it would try to import the flash-attn kernels); register under another name, e.g. {NAME!r}"
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_builder)
    return name

"""distflash as a transformers attention implementation.

``register()`` once, then ``AutoModelForCausalLM.from_pretrained(..., attn_implementation="distattn")``
runs every attention layer through :func:`distflash.attention.attend_head_major`. Causal
attention only: a padding mask or packed documents (which transformers turns into an attention
mask) are refused with a ValueError, never silently ignored. For that, the mask builder
registered beside the attention is transformers' own SDPA one, which hands over no mask where
plain causal attention is exact. Decoding with a KV cache (fewer queries than keys) goes to
transformers' SDPA attention, which computes it exactly.

The name is ``distattn``, not ``distflash``: transformers takes any implementation whose name
contains "flash" for a FlashAttention build (``is_flash_attention_requested`` is a substring
test) and then tries to import the flash-attn kernels for it, or swaps in a model's
"compatible" flash implementation; so such names are refused.
"""

NAME = "distattn"


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention signature: query ``[batch, heads, seq, head_dim]``, key and value
    ``[batch, kv_heads, seq, head_dim]``; returns ``(output [batch, seq, heads, head_dim], None)``."""
    if attention_mask is not None:
        raise ValueError(
            "distflash attention is causal only and got an attention mask (padding or packed documents); "
            "pass unpadded sequences of one length without an attention_mask, or use attn_implementation=\"sdpa\""
        )
    if dropout:
        raise ValueError(
            f"distflash attention has no dropout, and this layer asks for {dropout}; set the config's attention_dropout to 0"
        )
    if is_causal is False or (is_causal is None and getattr(module, "is_causal", True) is False):
        raise ValueError("distflash attention is causal only; this layer is not causal: use attn_implementation=\"sdpa\"")
    if query.shape[2] != key.shape[2]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    from .attention import attend_head_major

    out, _lse = attend_head_major(query, key, value, softmax_scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register(name=NAME):
    """Registers ``attention_forward`` and its mask builder under ``name`` with transformers'
    ``AttentionInterface`` and ``AttentionMaskInterface``; returns the name to pass as
    ``attn_implementation``."""
    if "flash" in name:
        raise ValueError(
            f"the name {name!r} contains \"flash\", which transformers takes for a FlashAttention build "
            f"(it would try to import the flash-attn kernels); register under another name, e.g. {NAME!r}"
        )
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name

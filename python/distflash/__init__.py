"""distflash from PyTorch: its exact FlashAttention CUDA kernels as an autograd function.

- :func:`flash_attn`: causal attention of CUDA bf16/fp16 ``[batch, seq, heads, head_dim]``
  tensors (GQA/MQA), on torch's memory and current stream, optionally under packed documents,
  a sliding window and global tokens.
- :func:`distflash.transformers.register`: ``attn_implementation="distattn"`` for
  transformers models.

torch is imported on first use, so this package imports (and checks its arguments) without it.
"""

from ._checks import HEAD_DIMS
from .attention import flash_attn

__all__ = ["HEAD_DIMS", "flash_attn"]

"""distflash from PyTorch: its exact FlashAttention CUDA kernels as an autograd function.

- :func:`flash_attn`: causal attention of CUDA bf16/fp16 ``[batch, seq, heads, head_dim]``
  tensors (GQA/MQA), on torch's memory and current stream, optionally under packed documents,
  a sliding window and global tokens.
- :func:`dist_flash_attn`: the same over the ranks of a group, each passing its chunk of the
  sequence (a ``torch.distributed`` group over NCCL, or a :class:`VirtualGroup` of ranks
  sharing one GPU); :func:`split_sequence` and :func:`join_sequence` cut a sequence into the
  ranks' chunks and put it back (balanced or zigzag order).
- :func:`distflash.transformers.register`: ``attn_implementation="distattn"`` for
  transformers models.

torch is imported on first use, so this package imports (and checks its arguments) without it.
"""

from ._checks import HEAD_DIMS
from .attention import flash_attn
from .dist import SCHEDULES, VirtualGroup, chunk_spans, dist_flash_attn, join_sequence, split_sequence

__all__ = [
    "HEAD_DIMS",
    "SCHEDULES",
    "VirtualGroup",
    "chunk_spans",
    "dist_flash_attn",
    "flash_attn",
    "join_sequence",
    "split_sequence",
]

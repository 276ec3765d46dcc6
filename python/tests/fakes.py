"""Duck-typed stand-ins for torch tensors: what ``distflash._checks`` reads of a tensor, so the
argument checks are tested without torch (PyPI's torch wheels bring gigabytes of CUDA) or a GPU."""


class Device:
    def __init__(self, type_="cuda", index=0):
        self.type = type_
        self.index = index

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __repr__(self):
        return f"{self.type}:{self.index}" if self.index is not None else self.type


class Dtype:
    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return self.name == other.name

    def __str__(self):
        return f"torch.{self.name}"


class Tensor:
    def __init__(self, shape, dtype="bfloat16", device=None, contiguous=True):
        self.shape = tuple(shape)
        self.dtype = Dtype(dtype)
        self.device = device or Device()
        self._contiguous = contiguous

    def dim(self):
        return len(self.shape)

    def is_contiguous(self):
        return self._contiguous


def qkv(batch=2, seq=100, heads=8, kv_heads=2, head_dim=128, **kw):
    """Valid [batch, seq, heads, head_dim] q, k, v."""
    return (
        Tensor((batch, seq, heads, head_dim), **kw),
        Tensor((batch, seq, kv_heads, head_dim), **kw),
        Tensor((batch, seq, kv_heads, head_dim), **kw),
    )

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
    def __init__(self, shape, dtype="bfloat16", device=None):
        self.shape = tuple(shape)
        self.dtype = Dtype(dtype)
        self.device = device or Device()

    def dim(self):
        return len(self.shape)


def qkv(batch=2, seq=100, heads=8, kv_heads=2, head_dim=128, **kw):
    """Valid [batch, seq, heads, head_dim] q, k, v."""
    return (
        Tensor((batch, seq, heads, head_dim), **kw),
        Tensor((batch, seq, kv_heads, head_dim), **kw),
        Tensor((batch, seq, kv_heads, head_dim), **kw),
    )


class IntTensor:
    """A 2-D integer tensor over nested lists, with what ``distflash._hf_masks`` does to
    position ids (``[:, a:b]`` slices, subtraction, ``!= n``, ``nonzero()``, ``tolist()``) and
    torch's meaning for each: ``nonzero()`` gives the ``[row, column]`` of every nonzero entry."""

    def __init__(self, rows):
        self.rows = [list(r) for r in rows]

    @property
    def shape(self):
        return (len(self.rows), len(self.rows[0]) if self.rows else 0)

    def __getitem__(self, index):
        rows, cols = index
        return IntTensor([r[cols] for r in self.rows[rows]])

    def __sub__(self, other):
        return IntTensor([[a - b for a, b in zip(x, y)] for x, y in zip(self.rows, other.rows)])

    def __ne__(self, n):
        return IntTensor([[int(a != n) for a in r] for r in self.rows])

    def nonzero(self):
        return IntTensor([[i, j] for i, r in enumerate(self.rows) for j, a in enumerate(r) if a])

    def tolist(self):
        return [list(r) for r in self.rows]

    def all(self):
        return all(all(r) for r in self.rows)

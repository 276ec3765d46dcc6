"""The Rust extension imports without a GPU and refuses bad arguments with a ValueError before
touching one (so these run on a machine without CUDA)."""

import pytest

import distflash
from distflash import _distflash

# A 16-byte-aligned stand-in address: the checks read it, nothing dereferences it.
ADDR = 0x10000
SHAPE = dict(batch=1, seq=16, heads=4, kv_heads=2, head_dim=64)
# torch's [b, s, h, d] strides as the extension takes them: (batch, head, sequence).
STRIDES = dict(q_strides=[16 * 4 * 64, 64, 4 * 64], kv_strides=[16 * 2 * 64, 64, 2 * 64])


def forward(**kw):
    args = dict(device=0, dtype="bfloat16", stream=0, **SHAPE, q=ADDR, k=ADDR, v=ADDR, out=ADDR, lse=ADDR, **STRIDES)
    args.update(kw)
    _distflash.forward(**args)


def backward(**kw):
    args = dict(device=0, dtype="bfloat16", stream=0, **SHAPE, **STRIDES)
    args.update({n: ADDR for n in ("q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv")})
    args.update(kw)
    _distflash.backward(**args)


def test_head_dims_agree_with_the_kernels():
    assert tuple(_distflash.HEAD_DIMS) == distflash.HEAD_DIMS


@pytest.mark.parametrize("call", [forward, backward])
def test_rust_refuses_bad_arguments(call):
    with pytest.raises(ValueError, match=r"not float32; convert with"):
        call(dtype="float32")
    with pytest.raises(ValueError, match=r"must be a multiple of kv-heads \(3\)"):
        call(kv_heads=3)
    with pytest.raises(ValueError, match=r"supports head dims 64, 80, 96, 128, 192 and 256, not 72"):
        call(head_dim=72)
    with pytest.raises(ValueError, match=r"^the sequence is empty"):
        call(seq=0)
    with pytest.raises(ValueError, match=r"^q has a null device address"):
        call(q=0)
    with pytest.raises(ValueError, match=r"^v starts at 0x10002, which is not 16-byte aligned"):
        call(v=ADDR + 2)


def test_backward_checks_its_gradients_addresses():
    with pytest.raises(ValueError, match=r"^dk has a null device address"):
        backward(dk=0)
    with pytest.raises(ValueError, match=r"^the output's gradient has a null device address"):
        backward(dout=0)


@pytest.mark.parametrize("call", [forward, backward])
def test_rust_refuses_bad_masks(call):
    with pytest.raises(ValueError, match=r"^the 2 document lengths add up to 15 tokens but the sequence has 16"):
        call(doc_lens=[5, 10])
    with pytest.raises(ValueError, match=r"^document 0 has length 0"):
        call(doc_lens=[0, 16])
    with pytest.raises(ValueError, match=r"^a window of 0 tokens hides every key"):
        call(window=0)
    with pytest.raises(ValueError, match=r"^17 global tokens do not fit a sequence of 16"):
        call(doc_lens=[8, 8], **{"global": 17})


@pytest.mark.parametrize("call", [forward, backward])
def test_rust_refuses_strides_the_kernels_cannot_take(call):
    with pytest.raises(ValueError, match=r"^q \(and the output, dq\) has a stride of 260 elements"):
        call(q_strides=[16 * 4 * 64, 64, 260])
    with pytest.raises(ValueError, match=r"^q \(and the output, dq\) would overlap itself"):
        call(q_strides=[16 * 4 * 64, 0, 4 * 64])
    # A batch of one: its stride never moves the address, so any is taken.
    with pytest.raises(ValueError, match=r"^q has a null device address"):
        call(q=0, q_strides=[1, 64, 4 * 64])


def test_backward_refuses_overlapping_kv_gradients():
    # K and V expanded over their heads may be read (forward) but their gradients not written.
    with pytest.raises(ValueError, match=r"^q has a null device address"):
        forward(q=0, kv_strides=[16 * 64, 0, 64])
    with pytest.raises(ValueError, match=r"^dk and dv \(and k, v\) would overlap itself"):
        backward(kv_strides=[16 * 64, 0, 64])


@pytest.mark.parametrize("call", [forward, backward])
def test_library_errors_raise_the_exception_of_their_kind(call):
    # The library marks its errors with a kind (distflash::ErrorKind) and the extension raises
    # by it, the sentence unchanged: the caller's input is a ValueError...
    with pytest.raises(ValueError, match=r"^heads and kv-heads must be at least 1$"):
        call(kv_heads=0)
    with pytest.raises(ValueError, match=r"^q \(and the output, dq\) has rows 2147483656 elements apart, beyond the kernels' 32-bit row strides"):
        call(q_strides=[16 * 4 * 64, 64, 2**31 + 8])
    # ...and a call that passes every check but names a GPU this machine lacks (or finds no
    # driver at all) is a RuntimeError, raised before any kernel could run.
    with pytest.raises(RuntimeError, match=r"^(no CUDA driver found; use --device cpu|GPU 4096 was asked for but this machine has \d+)"):
        call(device=4096)


def test_kv_gradients_come_in_the_input_dtype_exactly_under_mha():
    assert _distflash.kv_grads_in_input_dtype(1, 16, 4, 4, 64)
    assert not _distflash.kv_grads_in_input_dtype(1, 16, 4, 2, 64)

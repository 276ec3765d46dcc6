"""The argument checks of ``flash_attn`` answer every wrong argument with one sentence."""

import math

import pytest

from distflash import _checks
from fakes import Device, Tensor, qkv


def test_valid_inputs_give_the_kernels_shape():
    shape = _checks.check_inputs(*qkv())
    assert shape == _checks.Shape(2, 100, 8, 2, 128, "bfloat16", 0)
    q, k, v = qkv(batch=1, seq=1, heads=4, kv_heads=1, head_dim=64, dtype="float16", device=Device("cuda", 3))
    assert _checks.check_inputs(q, k, v) == _checks.Shape(1, 1, 4, 1, 64, "float16", 3)


def test_head_major_reads_heads_before_seq():
    q = Tensor((2, 8, 100, 64))
    k = Tensor((2, 2, 100, 64))
    shape = _checks.check_inputs(q, k, k, head_major=True)
    assert (shape.seq, shape.heads, shape.kv_heads) == (100, 8, 2)


def refused(exc, match, *args, **kw):
    with pytest.raises(exc, match=match):
        _checks.check_inputs(*args, **kw)


def test_wrong_device_dtype_and_type(monkeypatch):
    monkeypatch.setattr(_checks, "gpu_present", lambda: True)
    q, k, v = qkv()
    refused(ValueError, r"^q is on cpu; .*\.cuda\(\)$", Tensor(q.shape, device=Device("cpu", None)), k, v)
    refused(TypeError, r"^k is torch.float32; .*\.to\(torch.bfloat16\)$", q, Tensor(k.shape, dtype="float32"), v)
    refused(TypeError, r"^v must be a torch.Tensor, got list$", q, k, [1, 2])
    refused(ValueError, r"must be on one GPU", q, k, Tensor(v.shape, device=Device("cuda", 1)))
    refused(TypeError, r"must have one dtype", q, k, Tensor(v.shape, dtype="float16"))


def test_a_tensor_off_the_gpu_on_a_machine_without_one_is_told_what_to_use_instead(monkeypatch):
    monkeypatch.setattr(_checks, "gpu_present", lambda: False)
    q, k, v = qkv()
    cpu = Tensor(q.shape, device=Device("cpu", None))
    refused(
        ValueError,
        r"^q is on cpu, and torch sees no CUDA GPU here: distflash's kernels need an NVIDIA GPU; "
        r"on this machine use torch.nn.functional.scaled_dot_product_attention, or the CPU "
        r"reference of the distflash command line \(distflash attention --check\)$",
        cpu,
        k,
        v,
    )


def test_wrong_layout():
    q, k, v = qkv()
    refused(ValueError, r"^q has 3 dimensions \(2, 100, 1024\); .*\[batch, seq, heads, head_dim\]", Tensor((2, 100, 1024)), k, v)


def test_shape_mismatches():
    q, k, v = qkv(heads=8, kv_heads=3)
    refused(ValueError, r"q has 8 heads and k, v have 3: the kv heads must divide", q, k, v)
    q, k, v = qkv(head_dim=72)
    refused(ValueError, r"^head dim 72 is not supported: .* take head dim 64, 80, 96, 128, 192 or 256$", q, k, v)
    q, k, _ = qkv()
    refused(ValueError, r"k and v must have one shape", q, k, Tensor((2, 100, 4, 128)))
    refused(ValueError, r"q has batch 2 but k and v have batch 3", q, *qkv(batch=3)[1:])
    refused(ValueError, r"q has 100 tokens but k and v have 99", q, *qkv(seq=99)[1:])
    refused(ValueError, r"q has head dim 128 but k and v have head dim 64", q, *qkv(head_dim=64)[1:])
    refused(ValueError, r"at least one sequence of one token", *qkv(seq=0))


def test_causal_and_scale():
    refused(ValueError, r"causal=False is not supported", *qkv(), causal=False)
    refused(ValueError, r"softmax_scale=0.5 is not supported: .* 0.0883883; pass None$", *qkv(), softmax_scale=0.5)
    for scale in (128 ** -0.5, 1 / math.sqrt(128)):
        assert _checks.check_inputs(*qkv(), softmax_scale=scale).head_dim == 128


def test_masks_are_checked_against_the_sequence():
    assert _checks.check_mask(100) == _checks.Mask((), None, 0)
    assert _checks.check_mask(100, doc_lens=[1, 99], window=7.0, global_tokens=3) == _checks.Mask((1, 99), 7, 3)
    assert _checks.check_mask(100, cu_seqlens=(0, 30, 100)) == _checks.Mask((30, 70), None, 0)

    def bad(exc, match, **kw):
        with pytest.raises(exc, match=match):
            _checks.check_mask(100, **kw)

    bad(ValueError, r"^the 2 document lengths add up to 90 tokens but the sequence has 100: make them sum", doc_lens=[40, 50])
    bad(ValueError, r"^document 1 has length 0: every document needs at least one token$", doc_lens=[100, 0])
    bad(TypeError, r"^every entry of doc_lens must be a whole number, got 2.5$", doc_lens=[97, 2.5, 0.5])
    bad(TypeError, r"^doc_lens must be a sequence of ints, got int$", doc_lens=100)
    bad(ValueError, r"^pass doc_lens or cu_seqlens, not both", doc_lens=[100], cu_seqlens=[0, 100])
    bad(ValueError, r"^cu_seqlens must run from 0 to the sequence length 100, got \[0, 99\]$", cu_seqlens=[0, 99])
    bad(ValueError, r"^window=0 hides every key: pass 1 or more", window=0)
    bad(TypeError, r"^window must be a whole number, got '4'$", window="4")
    bad(ValueError, r"^global_tokens=-1: pass a count of 0 or more$", global_tokens=-1)
    bad(ValueError, r"^101 global tokens do not fit a sequence of 100: pass 100 or fewer$", global_tokens=101)

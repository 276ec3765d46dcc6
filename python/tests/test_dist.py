"""``dist_flash_attn``'s arguments, its split/join helpers' index arithmetic and the extension's
own refusals of distributed calls, without torch or a GPU (the GPU run is
bench/peers/dist_binding.py)."""

import pytest

import distflash
from distflash import _distflash, dist
from fakes import Device, Tensor, qkv


def test_chunk_spans_balanced_and_zigzag():
    assert [distflash.chunk_spans(12, 3, r) for r in range(3)] == [[(0, 4)], [(4, 8)], [(8, 12)]]
    # zigzag over 2 ranks: 4 chunks of 2, rank 0 the first and last, rank 1 the middle two.
    assert distflash.chunk_spans(8, 2, 0, "zigzag") == [(0, 2), (6, 8)]
    assert distflash.chunk_spans(8, 2, 1, "zigzag") == [(2, 4), (4, 6)]
    assert distflash.chunk_spans(12, 3, 2, "zigzag") == [(4, 6), (6, 8)]
    assert distflash.chunk_spans(5, 1, 0) == [(0, 5)]


@pytest.mark.parametrize("schedule", distflash.SCHEDULES)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_split_then_join_gives_the_sequence_back(world, schedule):
    seq = list(range(2 * world * 3))
    chunks = [distflash.split_sequence(seq, world, r, schedule, dim=0) for r in range(world)]
    assert all(len(c) == len(seq) // world for c in chunks)
    assert sorted(t for c in chunks for t in c) == seq, "every token on exactly one rank"
    assert distflash.join_sequence(chunks, schedule, dim=0) == seq
    for r, c in enumerate(chunks):
        assert c == [t for a, b in distflash.chunk_spans(len(seq), world, r, schedule) for t in range(a, b)]


def test_zigzag_chunks_pair_early_with_late_rows():
    chunks = [distflash.split_sequence(list(range(8)), 2, r, "zigzag", dim=0) for r in range(2)]
    assert chunks == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_split_and_join_refuse_with_sentences():
    with pytest.raises(ValueError, match=r"^unknown schedule 'ring': use 'balanced' or 'zigzag'$"):
        distflash.chunk_spans(8, 2, 0, "ring")
    with pytest.raises(ValueError, match=r"^the world size is 0; a group needs at least one rank$"):
        distflash.chunk_spans(8, 0, 0)
    with pytest.raises(ValueError, match=r"^rank 2 is outside a world of 2 ranks"):
        distflash.chunk_spans(8, 2, 2)
    with pytest.raises(ValueError, match=r"does not cut into 4 equal chunks for 2 ranks under 'zigzag'; pad or trim it to a multiple of 4$"):
        distflash.chunk_spans(10, 2, 0, "zigzag")
    with pytest.raises(ValueError, match=r"a sequence of 1 tokens does not cut into 2"):
        distflash.chunk_spans(1, 2, 0)
    with pytest.raises(ValueError, match=r"joining under 'zigzag' needs equal chunks of an even length"):
        distflash.join_sequence([[0, 1, 2], [3, 4]], "zigzag", dim=0)
    with pytest.raises(ValueError, match=r"the world size is 0"):
        distflash.join_sequence([], dim=0)
    with pytest.raises(ValueError, match=r"a list is one-dimensional"):
        distflash.split_sequence([1, 2], 1, 0)


def refused(exc, match, *args, **kw):
    with pytest.raises(exc, match=match):
        distflash.dist_flash_attn(*args, **kw)


def ranks(world, **kw):
    """Every rank's (q, k, v) as lists: the arguments of a virtual group's call."""
    chunks = [qkv(**kw) for _ in range(world)]
    return [list(t) for t in zip(*chunks)]


def test_virtual_group_arguments():
    with pytest.raises(ValueError, match=r"^the world size is 0; a group needs at least one rank$"):
        distflash.VirtualGroup(0)
    with pytest.raises(TypeError, match=r"world size must be an int"):
        distflash.VirtualGroup(2.0)
    with pytest.raises(ValueError, match=r"timeout=0"):
        distflash.VirtualGroup(2, timeout=0)
    g = distflash.VirtualGroup(2)
    refused(ValueError, r"^unknown schedule 'ring'", *ranks(2), group=g, schedule="ring")
    refused(TypeError, r"^with a VirtualGroup, q must be a list of every rank's chunk, got Tensor$", *qkv(), group=g)
    refused(ValueError, r"^VirtualGroup\(2\) has 2 ranks, but 3 k chunks were passed; pass one per rank$",
            ranks(2)[0], ranks(3)[1], ranks(2)[2], group=g)
    q, k, v = ranks(2)
    q[1], k[1], v[1] = qkv(seq=99)
    refused(ValueError, r"^rank 1's chunk is \[batch 2, 99 tokens, .*\] bfloat16 on cuda:0 but rank 0's is \[batch 2, 100 tokens.*every rank holds an equal chunk", q, k, v, group=g)
    q, k, v = ranks(2)
    q[1], k[1], v[1] = qkv(device=Device("cuda", 1))
    refused(ValueError, r"^rank 1's chunk is .* on cuda:1 but rank 0's is .* on cuda:0", q, k, v, group=g)
    q, k, v = ranks(2)
    k[0] = v[0] = Tensor((2, 98, 2, 128))
    refused(ValueError, r"q has 100 tokens but k and v have 98", q, k, v, group=g)
    refused(ValueError, r"^rank 0: q has 99 tokens, an odd number; under 'zigzag'", *ranks(2, seq=99), group=g, schedule="zigzag")
    # Masks are over the whole sequence: 2 ranks of 100 tokens hold 200.
    refused(ValueError, r"^the 2 document lengths add up to 100 tokens but the sequence has 200", *ranks(2), group=g, doc_lens=[50, 50])
    refused(ValueError, r"^window=0 hides every key", *ranks(2), group=g, window=0)
    refused(ValueError, r"^cu_seqlens must run from 0 to the sequence length 200", *ranks(2), group=g, cu_seqlens=[0, 100])


def test_process_group_arguments():
    refused(TypeError, r"^q is a list: lists of every rank's chunk go with group=distflash.VirtualGroup", *ranks(2))
    refused(ValueError, r"^unknown schedule 'ring'", *qkv(), schedule="ring")
    refused(ValueError, r"^q has 99 tokens, an odd number", *qkv(seq=99), schedule="zigzag")
    refused(ValueError, r"^q is on cpu", *qkv(device=Device("cpu", None)))
    # Chunks are copied to the kernels' layout, so a split's strided view is taken as it is.
    assert dist.check_rank(None, *qkv(), "balanced").seq == 100


# A 16-byte-aligned stand-in address: the checks read it, nothing dereferences it.
ADDR = 0x10000
SHAPE = (1, 16, 4, 2, 64)


def virtual(pass_, world=2, schedule="balanced", shape=SHAPE, chunks=1, addr=ADDR, n=5, dtype="bfloat16"):
    ranks = [[[addr] * n] * chunks for _ in range(world)]
    _distflash.virtual_pass(pass_, 0, dtype, 0, world, schedule, shape, ranks, 10.0)


@pytest.mark.parametrize("pass_,n", [("forward", 5), ("backward", 9)])
def test_the_extension_refuses_bad_distributed_calls(pass_, n):
    call = lambda **kw: virtual(pass_, n=n, **kw)  # noqa: E731
    with pytest.raises(ValueError, match=r"^unknown schedule 'ring'"):
        call(schedule="ring")
    with pytest.raises(ValueError, match=r"^schedule 'unbalanced' is not offered here: use 'balanced' or 'zigzag'$"):
        call(schedule="unbalanced")
    with pytest.raises(ValueError, match=r"^the world size is 0"):
        call(world=0)
    with pytest.raises(ValueError, match=r"^rank 0 owns 2 chunks under 'zigzag', but 1 were passed$"):
        call(schedule="zigzag")
    with pytest.raises(ValueError, match=r"holds 15 tokens, an odd number"):
        call(schedule="zigzag", shape=(1, 15, 4, 2, 64), chunks=2)
    with pytest.raises(ValueError, match=r"supports head dims 64, 80, 96, 128, 192 and 256, not 72"):
        call(shape=(1, 16, 4, 2, 72))
    with pytest.raises(ValueError, match=r"^q has a null device address"):
        call(addr=0)
    with pytest.raises(ValueError, match=r"not float32; convert with"):
        call(dtype="float32")
    with pytest.raises(ValueError, match=rf"^a chunk of this pass has {n} addresses, this one 4$"):
        virtual(pass_, n=4)
    with pytest.raises(ValueError, match=r"^a virtual group of 3 ranks got the chunks of 2 ranks"):
        _distflash.virtual_pass(pass_, 0, "bfloat16", 0, 3, "balanced", SHAPE, [[[ADDR] * n]] * 2, 10.0)
    with pytest.raises(ValueError, match=r"^unknown pass 'sideways'"):
        virtual("sideways")
    # The mask is checked against the whole sequence (2 ranks × 16 tokens) in Rust as well.
    ranks = [[[ADDR] * n]] * 2
    with pytest.raises(ValueError, match=r"^the 2 document lengths add up to 16 tokens but the sequence has 32"):
        _distflash.virtual_pass(pass_, 0, "bfloat16", 0, 2, "balanced", SHAPE, ranks, 10.0, ([8, 8], None, 0))
    with pytest.raises(ValueError, match=r"^a window of 0 tokens hides every key"):
        _distflash.virtual_pass(pass_, 0, "bfloat16", 0, 2, "balanced", SHAPE, ranks, 10.0, ([], 0, 0))


@pytest.mark.parametrize("pass_,n", [("forward", 5), ("backward", 9)])
def test_library_errors_of_a_distributed_call_raise_the_exception_of_their_kind(pass_, n):
    # distflash::rank_call refuses an empty chunk as the caller's input: a ValueError.
    with pytest.raises(ValueError, match=r"^this rank's chunk is empty; every rank must hold at least one token$"):
        virtual(pass_, n=n, shape=(1, 0, 4, 2, 64))
    # Every check passed, the GPU is missing (or the driver): a RuntimeError, before any kernel.
    ranks = [[[ADDR] * n]] * 2
    with pytest.raises(RuntimeError, match=r"^(no CUDA driver found; use --device cpu|GPU 4096 was asked for but this machine has \d+)"):
        _distflash.virtual_pass(pass_, 4096, "bfloat16", 0, 2, "balanced", SHAPE, ranks, 10.0)


def test_the_extension_refuses_a_bad_nccl_group():
    with pytest.raises(ValueError, match=r"^rank 2 of a world of 2"):
        _distflash.nccl_group(0, "bfloat16", 0, 2, 2, bytes(128))
    with pytest.raises(ValueError, match=r"^an NCCL id has 128 bytes, this one 5"):
        _distflash.nccl_group(0, "bfloat16", 0, 0, 2, bytes(5))


def test_the_package_exports_the_distributed_api():
    assert distflash.dist_flash_attn is dist.dist_flash_attn
    assert distflash.SCHEDULES == ("balanced", "zigzag")

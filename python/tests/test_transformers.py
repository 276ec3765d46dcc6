"""The transformers attention: the masks it reads from transformers' keyword arguments, the
mask builder registered beside it, and what it refuses before touching a tensor (so without
torch or transformers here)."""

import random
import sys
import types

import pytest

import distflash.attention
from distflash import _checks
from distflash import _hf_masks as hm
from distflash import transformers as dt
from fakes import IntTensor, Tensor


class Layer:
    is_causal = True


def qkv(batch=1, seq=16):
    q = Tensor((batch, 8, seq, 64))
    k = Tensor((batch, 2, seq, 64))
    return q, k, k


def call(module=None, mask=None, batch=1, seq=16, **kw):
    return dt.attention_forward(module or Layer(), *qkv(batch, seq), mask, **kw)


def positions(*docs):
    """One row of position ids restarting at 0 at every document of the given lengths."""
    return [p for n in docs for p in range(n)]


# The oracle: transformers' own predicates (masking_utils), rewritten here in plain Python.


def transformers_documents(row):
    """find_packed_sequence_indices on one row: the diff of the positions, the first taken as 1
    (``prepend=position_ids[:, :1] - 1``), and a new sequence wherever it is not 1 (cumsum)."""
    ids, doc = [], 0
    for i, p in enumerate(row):
        if i > 0 and p - row[i - 1] != 1:
            doc += 1
        ids.append(doc)
    return ids


def transformers_sees(row, sliding_window, q, k):
    """causal_mask_function, and sliding_window_overlay's ``kv_idx > q_idx - sliding_window``,
    and packed_sequence_mask_function, as create_sliding_window_causal_mask (or
    create_causal_mask without a window) combines them."""
    doc = transformers_documents(row)
    return k <= q and (sliding_window is None or k > q - sliding_window) and doc[q] == doc[k]


def distflash_sees(mask, seq, q, k):
    """Which keys distflash's kernels let a query see under ``mask`` (shape::Mask): causal,
    within the document, within the window (itself and the window - 1 before)."""
    lens = mask.doc_lens or (seq,)
    doc = [i for i, n in enumerate(lens) for _ in range(n)]
    window = mask.window or seq
    return k <= q and doc[q] == doc[k] and q - k < window


def random_row(rng, seq):
    """Position ids of random documents, most restarting at 0, some at another number (which
    may happen to continue the last document: transformers then sees one document)."""
    row = []
    while len(row) < seq:
        n = min(rng.choice([1, 2, 3, 7, 16, 40]), seq - len(row))
        start = 0 if rng.random() < 0.7 else rng.choice([1, 5, row[-1] + 1 if row else 3])
        row += range(start, start + n)
    return row


def test_the_mask_read_from_position_ids_and_window_is_transformers_mask():
    rng = random.Random(21)
    for trial in range(60):
        seq = rng.choice([1, 2, 5, 33, 64])
        batch = rng.choice([1, 1, 3])
        row = random_row(rng, seq)
        window = rng.choice([None, 1, 2, 5, seq, seq + 3])
        args = hm.mask_arguments(batch, seq, sliding_window=window, position_ids=IntTensor([row] * batch))
        mask = _checks.check_mask(seq, **args)
        for q in range(seq):
            for k in range(seq):
                assert distflash_sees(mask, seq, q, k) == transformers_sees(row, window, q, k), (trial, row, window, q, k)


def test_position_ids_mark_documents():
    seq = 12
    read = lambda rows, batch=None: hm.documents_from_positions(IntTensor(rows), batch or len(rows), seq)
    assert read([list(range(seq))]) == ()  # one document
    assert read([positions(5, 4, 3)]) == (5, 4, 3)
    assert read([positions(1, 10, 1)]) == (1, 10, 1)  # one-token documents at both ends
    assert read([positions(*[1] * seq)]) == (1,) * seq  # all zeros: every token alone
    assert read([positions(6, 6)], batch=3) == (6, 6)  # [1, seq] ids stand for every row
    assert read([positions(6, 6)] * 2) == (6, 6)  # rows packed alike
    # Not starting at 0 is still one document; a jump other than a restart splits as well.
    assert read([list(range(7, 7 + seq))]) == ()
    assert read([[0, 1, 2, 7, 8, 9, 3, 4, 0, 1, 2, 3]]) == (3, 3, 2, 4)


def test_position_ids_packing_rows_differently_or_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"^the rows of the batch pack different documents \(position_ids: row 0 has "
                                         r"lengths \[6, 6\], row 1 \[12\]\); .*\(batch size 1, as DataCollatorWithFlattening"):
        hm.documents_from_positions(IntTensor([positions(6, 6), positions(12)]), 2, 12)
    for shape, batch in [((12,), 1), ((3, 1, 12), 1), ((1, 11), 1), ((2, 12), 3)]:
        with pytest.raises(ValueError, match=r"^position_ids have shape .* \[batch, seq\] = \[\d+, 12\]"):
            hm.documents_from_positions(Tensor(shape), batch, 12)


def test_cu_seq_lens_mark_documents_row_by_row():
    assert hm.documents_from_offsets([0, 12], [0, 12], 1, 12) == ()
    assert hm.documents_from_offsets([0, 5, 9, 12], [0, 5, 9, 12], 1, 12) == (5, 4, 3)
    # Two rows packed alike, as offsets over the flattened batch.
    assert hm.documents_from_offsets([0, 5, 12, 17, 24], [0, 5, 12, 17, 24], 2, 12) == (5, 7)
    assert hm.documents_from_offsets([0, 12, 24], [0, 12, 24], 2, 12) == ()


def test_bad_cu_seq_lens_are_refused():
    bad = [
        (([0, 5, 12], [0, 6, 12], 1), r"^cu_seq_lens_q \[0, 5, 12\] and cu_seq_lens_k \[0, 6, 12\] differ"),
        (([0, 5, 12], None, 1), r"^got only one of cu_seq_lens_q and cu_seq_lens_k"),
        (([0, 5, 11], [0, 5, 11], 1), r"^cu_seq_lens_q must increase from 0 to the batch's 12 tokens \(1 rows of 12\)"),
        (([0, 5, 5, 12], [0, 5, 5, 12], 1), r"must increase from 0"),
        (([0, 5, 24], [0, 5, 24], 2), r"a document crossing from row 0 into row 1 \(no offset 12\)"),
        (([0, 5, 12, 24], [0, 5, 12, 24], 2), r"^the rows of the batch pack different documents \(cu_seq_lens_q: "
                                              r"row 0 has lengths \[5, 7\], row 1 \[12\]\)"),
    ]
    for (cq, ck, batch), message in bad:
        with pytest.raises(ValueError, match=message):
            hm.documents_from_offsets(cq, ck, batch, 12)


def test_offsets_and_position_ids_together_must_agree():
    pos = IntTensor([positions(5, 7)])
    assert hm.mask_arguments(1, 12, 4, pos, [0, 5, 12], [0, 5, 12]) == {"doc_lens": (5, 7), "window": 4}
    with pytest.raises(ValueError, match=r"^cu_seq_lens_q packs documents of lengths \[5, 7\] but position_ids mark \[12\]; "):
        hm.mask_arguments(1, 12, None, IntTensor([list(range(12))]), [0, 5, 12], [0, 5, 12])
    assert hm.mask_arguments(1, 12) == {"doc_lens": None, "window": None}


def test_long_lists_are_cut_short_in_messages():
    assert hm._short(range(3)) == "[0, 1, 2]"
    assert hm._short(range(20)) == "[0, 1, 2, 3, 4, 5, 6, 7, ... (20 in all)]"


@pytest.fixture
def kernels(monkeypatch):
    """attend_head_major replaced by a recorder of its mask arguments."""
    calls = []

    class Out:
        def transpose(self, *dims):
            return self

        def contiguous(self):
            return self

    def record(q, k, v, softmax_scale=None, **masks):
        calls.append(masks)
        return Out(), None

    monkeypatch.setattr(distflash.attention, "attend_head_major", record)
    return calls


def test_window_and_packing_reach_the_kernels_as_flash_attn_takes_them(kernels):
    call(batch=2, sliding_window=4096, position_ids=IntTensor([positions(9, 7)]))
    call(cu_seq_lens_q=[0, 3, 16], cu_seq_lens_k=[0, 3, 16], max_length_q=13, max_length_k=13)
    call(position_ids=IntTensor([list(range(16))]))
    assert kernels == [{"doc_lens": (9, 7), "window": 4096}, {"doc_lens": (3, 13), "window": None},
                       {"doc_lens": None, "window": None}]


def test_bad_masks_are_refused_by_the_kernels_checks():
    # The real attend_head_major: its check_mask refuses before anything reaches the extension.
    with pytest.raises(ValueError, match=r"^window=0 hides every key"):
        call(sliding_window=0)
    with pytest.raises(ValueError, match=r"pack different documents"):
        call(batch=2, position_ids=IntTensor([positions(16), positions(8, 8)]))


def test_dense_masks_are_refused():
    for mask in (IntTensor([[1] * 15 + [0]]), Tensor((1, 1, 16, 16))):
        with pytest.raises(ValueError, match=r"^distflash attention got a dense attention mask .* DataCollatorWithFlattening"):
            call(mask=mask)


def test_dropout_non_causal_layers_softcap_and_sinks_are_refused():
    with pytest.raises(ValueError, match=r"no dropout, and this layer asks for 0.1"):
        call(dropout=0.1)
    with pytest.raises(ValueError, match=r"causal only; this layer is not causal"):
        call(is_causal=False)
    encoder = Layer()
    encoder.is_causal = False
    with pytest.raises(ValueError, match=r"this layer is not causal"):
        call(module=encoder)
    with pytest.raises(ValueError, match=r"^this layer asks for logit soft-capping \(softcap=...\)"):
        call(softcap=50.0)
    with pytest.raises(ValueError, match=r"^this layer asks for attention sinks \(s_aux=...\)"):
        call(s_aux=object())


def build(**kw):
    args = dict(batch_size=1, q_length=16, kv_length=16)
    args.update(kw)
    return dt.mask_builder(**args)


def test_the_mask_builder_hands_over_no_mask_for_whole_sequences():
    assert build() is None
    assert build(attention_mask=IntTensor([[1] * 16])) is None
    padded = IntTensor([[1] * 15 + [0]])
    assert build(attention_mask=padded) is padded  # for the attention to refuse, as above
    with pytest.raises(ValueError, match=r"got a dense attention mask"):
        call(mask=build(attention_mask=padded))


def test_the_mask_builder_refuses_what_the_keyword_arguments_cannot_say():
    with pytest.raises(ValueError, match=r"^this model adds mask functions of its own .* attn_implementation=\"sdpa\""):
        build(use_vmap=True)
    with pytest.raises(ValueError, match=r"^this model uses chunked attention \(attention_chunk_size=8192\)"):
        build(config=types.SimpleNamespace(attention_chunk_size=8192))


def test_the_mask_builder_leaves_cached_calls_to_transformers_sdpa_mask(monkeypatch):
    seen = []
    fake = types.ModuleType("transformers.masking_utils")
    fake.sdpa_mask = lambda **kw: seen.append(kw) or "dense"
    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", fake)
    predicate = object()
    # Decoding one token after 15, and a whole-length call at a cache offset.
    assert build(q_length=1, q_offset=15, kv_offset=0, mask_function=predicate, local_size=4, use_vmap=True) == "dense"
    assert build(q_offset=16, kv_offset=16) == "dense"
    assert seen[0] == dict(batch_size=1, q_length=1, kv_length=16, q_offset=15, kv_offset=0, attention_mask=None,
                           use_vmap=True, config=None, device="cpu", mask_function=predicate, local_size=4)
    assert "mask_function" not in seen[1] and seen[1]["q_offset"] == 16


def test_names_transformers_would_take_for_flash_attention_are_refused():
    with pytest.raises(ValueError, match=r"the name 'distflash' contains \"flash\", .* e.g. 'distattn'$"):
        dt.register("distflash")

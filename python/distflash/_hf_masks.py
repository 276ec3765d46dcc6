"""transformers' masking keyword arguments read as ``flash_attn``'s mask arguments, in plain
Python (tested without torch or transformers).

transformers 5 tells an attention implementation what to mask in two ways: a dense mask from
the mask builder registered beside it, or keyword arguments its flash-attention path reads.
distflash takes the second way, as that path does (``flash_attention_mask`` hands over no mask
where there is no padding): its attention reads

- ``sliding_window=W``, which Mistral's attention (and Qwen2's sliding layers) pass from the
  config. transformers masks ``kv_idx > q_idx - sliding_window`` on top of causality
  (``masking_utils.sliding_window_overlay``), so a token sees itself and the W - 1 keys before
  it: W keys, which is what ``flash_attn``'s ``window=W`` means. The number passes unchanged.
- packed documents, from ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (what
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` adds) or from ``position_ids``.
  From position ids a document starts at the first token and wherever a position is not the
  previous one plus one, as in transformers' ``find_packed_sequence_indices`` (what its SDPA
  mask uses): ids restarting at 0 are the usual case, any other jump splits as well, and a row
  that starts elsewhere than 0 is one document all the same.

distflash applies one mask to every row of a call, so the rows must pack alike (a batch of one
packed row, as the collator makes it, always does); rows that differ are refused. Where both
offsets and position ids are given they must agree: transformers' flash path would follow the
offsets and its SDPA path the position ids, so a disagreement has no one meaning. Where the two
paths differ, distflash does what the flash path does: packed position ids mark documents
also beside an all-ones ``attention_mask`` or a KV cache, where transformers' SDPA mask does
not look for packing (``_preprocess_mask_arguments``).
"""

from . import _checks

# How many entries of a long list a message shows.
_SHOWN = 8


def _short(values):
    """``values`` for a message: the first few entries of a long list."""
    values = list(values)
    if len(values) <= _SHOWN:
        return str(values)
    return "[" + ", ".join(map(str, values[:_SHOWN])) + f", ... ({len(values)} in all)]"


def _lengths(starts, end):
    """The lengths of the documents starting at ``starts`` (increasing, the first the row's
    start) and running to ``end``."""
    return [b - a for a, b in zip(starts, starts[1:] + [end])]


def _one_packing(rows, source):
    """The document lengths every row shares (``()``: one document per row), or a ValueError
    naming the first row that differs from row 0."""
    for i, row in enumerate(rows):
        if row != rows[0]:
            raise ValueError(
                f"the rows of the batch pack different documents ({source}: row 0 has lengths "
                f"{_short(rows[0])}, row {i} {_short(row)}); distflash applies one mask to the whole batch: "
                "pack every document into one row (batch size 1, as DataCollatorWithFlattening does) or pack the rows alike"
            )
    return tuple(rows[0]) if len(rows[0]) > 1 else ()


def documents_from_positions(position_ids, batch, seq):
    """Document lengths (``()``: one document) that ``[batch, seq]`` or ``[1, seq]`` position
    ids mark, the same for every row. The breaks are found where the ids are (on the GPU) and
    only they cross to the host."""
    shape = tuple(int(n) for n in position_ids.shape)
    if len(shape) != 2 or shape[1] != seq or shape[0] not in (1, batch):
        raise ValueError(
            f"position_ids have shape {shape}, but distflash reads packed documents from [batch, seq] = "
            f"[{batch}, {seq}] (or [1, {seq}]) position ids; pass those, or use attn_implementation=\"sdpa\""
        )
    # [row, i] wherever token i + 1 is not token i's position plus one: a document starts there.
    breaks = (position_ids[:, 1:] - position_ids[:, :-1] != 1).nonzero().tolist()
    starts = [[0] for _ in range(shape[0])]
    for row, i in breaks:
        starts[row].append(i + 1)
    return _one_packing([_lengths(s, seq) for s in starts], "position_ids")


def documents_from_offsets(cu_seq_lens_q, cu_seq_lens_k, batch, seq):
    """Document lengths (``()``: one document) from FlashAttention's varlen offsets over the
    batch's ``batch * seq`` tokens taken as one row after another; no document may cross from
    one row into the next, and every row must pack alike."""
    if cu_seq_lens_q is None or cu_seq_lens_k is None:
        raise ValueError(
            "got only one of cu_seq_lens_q and cu_seq_lens_k; pass both (the same offsets: distflash computes self-attention)"
        )
    offsets = _checks._as_ints(cu_seq_lens_q, "cu_seq_lens_q")
    keys = _checks._as_ints(cu_seq_lens_k, "cu_seq_lens_k")
    if keys != offsets:
        raise ValueError(
            f"cu_seq_lens_q {_short(offsets)} and cu_seq_lens_k {_short(keys)} differ; distflash computes "
            "self-attention over one packing: pass the same offsets for both"
        )
    total = batch * seq
    if len(offsets) < 2 or offsets[0] != 0 or offsets[-1] != total or any(b <= a for a, b in zip(offsets, offsets[1:])):
        raise ValueError(
            f"cu_seq_lens_q must increase from 0 to the batch's {total} tokens ({batch} rows of {seq}), got {_short(offsets)}"
        )
    present = set(offsets)
    for r in range(1, batch):
        if r * seq not in present:
            raise ValueError(
                f"cu_seq_lens_q {_short(offsets)} has a document crossing from row {r - 1} into row {r} (no offset {r * seq}); "
                "a document must lie within one row"
            )
    rows = [[o - r * seq for o in offsets if r * seq <= o < (r + 1) * seq] for r in range(batch)]
    return _one_packing([_lengths(s, seq) for s in rows], "cu_seq_lens_q")


def mask_arguments(batch, seq, sliding_window=None, position_ids=None, cu_seq_lens_q=None, cu_seq_lens_k=None):
    """``flash_attn``'s mask keyword arguments (``doc_lens``, ``window``) for what transformers
    passes an attention layer; ``attend_head_major`` checks them (``_checks.check_mask``)."""
    docs = None
    if cu_seq_lens_q is not None or cu_seq_lens_k is not None:
        docs = documents_from_offsets(cu_seq_lens_q, cu_seq_lens_k, batch, seq)
    if position_ids is not None:
        marked = documents_from_positions(position_ids, batch, seq)
        if docs is not None and marked != docs:
            raise ValueError(
                f"cu_seq_lens_q packs documents of lengths {_short(docs) if docs else [seq]} but position_ids mark "
                f"{_short(marked) if marked else [seq]}; transformers' flash-attention path would follow the first and its "
                "SDPA path the second: make them agree (position ids restarting at 0 at every document)"
            )
        docs = marked
    return {"doc_lens": docs or None, "window": sliding_window}

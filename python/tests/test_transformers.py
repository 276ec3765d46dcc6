"""The transformers attention refuses what it cannot compute exactly, before touching a tensor
(so without torch or transformers here)."""

import pytest

from distflash import transformers as dt
from fakes import Tensor


class Layer:
    is_causal = True


def call(module=None, mask=None, **kw):
    q = Tensor((1, 8, 16, 64), contiguous=False)
    k = Tensor((1, 2, 16, 64), contiguous=False)
    return dt.attention_forward(module or Layer(), q, k, k, mask, **kw)


def test_padding_masks_are_refused():
    with pytest.raises(ValueError, match=r"causal only and got an attention mask .* without an attention_mask"):
        call(mask=object())


def test_dropout_and_non_causal_layers_are_refused():
    with pytest.raises(ValueError, match=r"no dropout, and this layer asks for 0.1"):
        call(dropout=0.1)
    with pytest.raises(ValueError, match=r"causal only; this layer is not causal"):
        call(is_causal=False)
    encoder = Layer()
    encoder.is_causal = False
    with pytest.raises(ValueError, match=r"this layer is not causal"):
        call(module=encoder)


def test_names_transformers_would_take_for_flash_attention_are_refused():
    with pytest.raises(ValueError, match=r"the name 'distflash' contains \"flash\", .* e.g. 'distattn'$"):
        dt.register("distflash")

"""Copying a prefix's KV from one slot to another (`Engine.copy_prefix`, the server's cross-slot prefix
reuse): the slot that continues a copied prefix gives the next token exactly the logits a fresh prefill
of the whole prompt in that slot gives, on the batch-invariant CPU route and on the torch prefill layers
(a prefill tap selects them) with the copy at a prefill-batch boundary. A cache with recurrent state
refuses (it cannot be cut at a prefix)."""

from __future__ import annotations

import pytest
import torch

from gufo.engine.engine import Engine
from gufo.errors import BadInputError
from gufo.models.kv_cache import KVCache
from gufo.models.recurrent_state import RecurrentShape, RecurrentState
from gufo.options import RunOptions

BATCH = 16
PROMPT = [(7 * i + 3) % 500 + 10 for i in range(40)]
OTHER = [(11 * i + 5) % 500 + 10 for i in range(40)]  # what the target slot held before


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
@pytest.mark.parametrize("torch_prefill", [False, True], ids=["invariant", "torch-prefill"])
def test_a_copied_prefix_continues_as_a_fresh_prefill(model, torch_prefill):
    engine = Engine(model, options=RunOptions(threads=1), context=64, n_slots=3, batch_size=BATCH)
    if torch_prefill:
        engine.add_prefill_tap(0, lambda hidden: hidden)  # changes nothing but the route
    assert engine.invariant_prefill is not torch_prefill
    fresh = engine.prefill(PROMPT, slot=2)
    shared = BATCH if torch_prefill else 21  # the torch layers' batches start at the same positions
    engine.prefill(PROMPT[:shared] + OTHER[: 30 - shared], slot=0)  # a source with more than the prefix
    engine.prefill(OTHER, slot=1)
    engine.copy_prefix(0, 1, shared)
    copied = engine.prefill(PROMPT[shared:], slot=1, start=shared)
    assert torch.equal(copied.cpu(), fresh.cpu())
    # the source slot is untouched: it continues its own sequence as before
    assert torch.equal(engine.prefill(PROMPT[shared:], slot=0, start=shared).cpu(), copied.cpu())


def test_a_cache_with_recurrent_state_refuses_to_copy_a_prefix():
    shape = RecurrentShape(layers=(1,), conv=(4, 3), delta=(2, 4, 4))
    cache = KVCache(2, 2, 1, 8, 4, 4, attention_layers=[0], recurrent=RecurrentState(shape, 2))
    with pytest.raises(ValueError, match="recurrent state"):
        cache.copy_prefix(0, 1, 4)


def test_an_engine_with_recurrent_state_refuses_to_copy_a_prefix():
    engine = Engine("smollm2-135m", options=RunOptions(threads=1), context=16, n_slots=2)
    shape = RecurrentShape(layers=(1,), conv=(4, 3), delta=(2, 4, 4))
    engine.cache.recurrent = RecurrentState(shape, 2)  # as a hybrid model's cache has
    assert not engine.rewindable
    with pytest.raises(BadInputError, match="recurrent state"):
        engine.copy_prefix(0, 1, 4)

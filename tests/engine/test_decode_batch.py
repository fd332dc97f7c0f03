"""A batched decode step of several sequences (different slots, different positions) gives each row
exactly the logits its own one-token step gives (the step the llama.cpp golden tests check), in one
pass of the fused CPU layer."""

from __future__ import annotations

import pytest
import torch

from gufo.engine.engine import Engine
from gufo.errors import BadInputError
from gufo.options import RunOptions

PROMPTS = [[1, 5, 9, 20], [3, 4], [7, 8, 9, 10, 11, 12, 13]]


def prefilled(model: str) -> Engine:
    engine = Engine(model, options=RunOptions(threads=2), context=128, n_slots=len(PROMPTS))
    for slot, prompt in enumerate(PROMPTS):
        engine.prefill(prompt, slot=slot)
    return engine


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_batched_rows_equal_their_own_decode_steps(model, monkeypatch):
    tokens, positions, slots = [42, 43, 44], [len(p) for p in PROMPTS], [0, 1, 2]
    alone = prefilled(model)
    want = torch.stack([alone.decode(t, p, s) for t, p, s in zip(tokens, positions, slots, strict=True)])
    batched = prefilled(model)
    assert batched.model.decode_route.multi_slot
    monkeypatch.setattr(Engine, "decode", lambda *a, **k: pytest.fail("decode_batch fell back to rows"))
    got = batched.decode_batch(tokens, positions, slots)
    assert torch.equal(got, want)
    # the next step reads the KV entries the batched step wrote: still equal
    monkeypatch.undo()
    after = [alone.decode(7, p + 1, s) for p, s in zip(positions, slots, strict=True)]
    assert torch.equal(batched.decode_batch([7, 7, 7], [p + 1 for p in positions], slots), torch.stack(after))


def test_a_row_past_the_context_is_bad_input():
    engine = prefilled("smollm2-135m")
    with pytest.raises(BadInputError, match="context size 128"):
        engine.decode_batch([1, 2], [5, 128], [0, 1])

"""`PromptCache`, the reuse rule `gufo chat` and the server share: a conversation's turns, each
prefilled after the prefix the slot can reuse, get the logits of the turn's own prompt, and reuse
exactly the prefix worked out by hand for each kind of cache.

The stand-in engines (tests/server) keep each slot's tokens by position and give logits that are a hash
of them; the recurrent one also fails when a slot is fed anywhere but right after the tokens its state
has taken in, or resumes a saved state that is not its KV's prefix. The oracle is the same hash of the
turn's prompt, in plain Python."""

from __future__ import annotations

import pytest
import torch

from gufo.engine.prompt_cache import PromptCache
from tests.server.test_queued_steps import TokenCache, logits_after
from tests.server.test_state_checkpoints import RecurrentCache

CHUNK = 4
FIRST = [5, 9, 11, 2, 7, 3]  # 6 tokens: one whole chunk and a part
REPLY = [8, 1, 6, 4]  # the first reply; its last token ends the reply and is never fed
SECOND = FIRST + REPLY + [2, 9]  # the next turn: the conversation so far and 2 tokens more (12)
THIRD = SECOND[:7] + [10, 10, 3]  # a re-rendered conversation that differs inside the first reply


class KVOnly(TokenCache):
    """A KV cache whose prefill is chunked (a GPU's): only whole chunks of prefilled tokens are reused."""

    invariant_prefill = False


class ChunkInvariant(TokenCache):
    """A KV cache whose prefill gives a token its numbers whatever its chunk, but not a decode step's (the
    GPU's fixed tiles): any prefix of prefilled tokens is reused, decoded tokens never."""

    invariant_prefill = False
    chunk_invariant = True


def converse(engine, cache: PromptCache, turns: list[list[int]]) -> list[int]:
    """Each turn prefilled through `cache` (its logits checked against the hash of the turn's prompt), then
    the first reply's tokens but the last fed one by one, as `Engine.generate` feeds them."""
    reused = []
    for turn in turns:
        logits, count = cache.prefill(0, turn)
        assert torch.equal(logits, torch.tensor(logits_after(turn)))
        reused.append(count)
        if turn is FIRST:
            for position, token in enumerate(REPLY[:-1], start=len(turn)):
                engine.decode_batch([token], [position], [0])
                cache.fed(0, [token])
        assert engine.slots[0][: len(cache.tokens[0])] == cache.tokens[0]
    return reused


@pytest.mark.parametrize(
    "make,checkpoints,want",
    [
        # any cached prefix: the first turn and its fed reply (9), then 7 of the second
        (lambda: TokenCache(1), None, [0, 9, 7]),
        # whole prefilled chunks only: FIRST's first chunk, then SECOND's first two (8 > 7: one)
        (lambda: KVOnly(1), None, [0, 4, 4]),
        # prefilled tokens at any length: FIRST (not its fed reply), then 7 of the second, all prefilled
        (lambda: ChunkInvariant(1), None, [0, 6, 7]),
        # the whole sequence held (9); then one saved state, the second prompt's end (12 > 7): none
        (lambda: RecurrentCache(1, invariant_prefill=True), 1, [0, 9, 0]),
        # three saved states: 4, 6 (the first prompt's end) and 12; the third resumes at 6
        (lambda: RecurrentCache(1, invariant_prefill=True), 3, [0, 9, 6]),
        # chunked prefill: states at chunk ends only (4, then 8 of the second), resumed at 4 both times
        (lambda: RecurrentCache(1, invariant_prefill=False), 3, [0, 4, 4]),
        # no saved state: only a slot's whole sequence, which a chunked prefill's reuse never reaches
        (lambda: RecurrentCache(1, invariant_prefill=False), 0, [0, 0, 0]),
    ],
    ids=[
        "kv",
        "kv-chunked",
        "kv-chunk-invariant",
        "recurrent-1-state",
        "recurrent-3-states",
        "recurrent-chunked",
        "no-states",
    ],
)
def test_each_turn_reuses_the_prefix_its_own_prefill_would_compute(make, checkpoints, want):
    engine = make()
    assert converse(engine, PromptCache(engine, CHUNK, checkpoints), [FIRST, SECOND, THIRD]) == want


def test_a_prefill_that_fails_leaves_the_slot_holding_nothing():
    """A chunk cut short (here the engine raises on the second) leaves the recurrent state unknown: the
    next prompt starts afresh instead of continuing it."""

    class Failing(RecurrentCache):
        calls = 0

        def prefill(self, tokens, slot, start=0):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("device lost")
            return super().prefill(tokens, slot, start)

    engine = Failing(1, invariant_prefill=True)
    cache = PromptCache(engine, CHUNK, 3)
    with pytest.raises(RuntimeError):
        cache.prefill(0, FIRST)
    assert cache.tokens[0] == [] and not cache.saved
    assert converse(engine, cache, [FIRST]) == [0]

"""A model with recurrent state resumes a shared prefix from a saved state (`Scheduler`'s
`state_checkpoints`): every request still gets the greedy chain of its own prompt, and a slot only ever
runs tokens right after the ones its state has taken in.

The stand-in engine keeps per slot the tokens its KV holds (by position) and the tokens its recurrent
state has taken in (a whole sequence: it only grows, or starts again at position 0, or is replaced by a
saved one), and gives logits that are a hash of the state's tokens. Feeding a slot a token anywhere but
right after its state's, or resuming a saved state whose tokens are not the KV's prefix, fails an
assertion; the oracle is the hash chained over the request's own prompt (test_queued_steps)."""

from __future__ import annotations

import weakref

import pytest
import torch

from gufo.engine.sampling import SamplingParams
from gufo.server.metrics import Metrics
from gufo.server.scheduler import Scheduler
from tests.server.test_queued_steps import GREEDY, TokenCache, check, logits_after, prompts, run_jobs


class RecurrentCache(TokenCache):
    rewindable = False

    def __init__(self, n_slots: int, invariant_prefill: bool):
        super().__init__(n_slots)
        self.invariant_prefill = invariant_prefill
        self.state: list[tuple[int, ...]] = [() for _ in range(n_slots)]
        self.saves = 0

    def _write(self, slot: int, start: int, tokens: list[int]) -> torch.Tensor:
        state = () if start == 0 else self.state[slot]
        assert len(state) == start, f"slot {slot}: fed at {start}, its state has taken in {len(state)}"
        super()._write(slot, start, tokens)
        assert tuple(self.slots[slot][: len(state)]) == state
        self.state[slot] = state + tuple(tokens)
        return torch.tensor(logits_after(list(self.state[slot])))

    def save_state(self, slot: int, into=None) -> tuple[int, ...]:
        self.saves += 1
        return self.state[slot]

    def copy_prefix(self, source: int, target: int, length: int, state=None) -> None:
        assert state is not None and len(state) == length
        assert tuple(self.slots[source][:length]) == state, "a saved state the source no longer holds"
        self.cache.copy_prefix(source, target, length)
        self.lengths[target] = length
        self.state[target] = state


@pytest.mark.parametrize("invariant", [False, True])
@pytest.mark.parametrize("saved", [1, 3, None])
def test_prompts_resume_saved_states_and_still_get_their_own_greedy_chains(invariant, saved):
    """Room for 1, 3 and (None) as many saved states as slots, in all; waves over 3 slots (more requests
    than slots): prompts sharing a 9-token prefix, then prompts that extend earlier ones (a
    conversation's next turn), then ones sharing only 5 tokens, then their next turns; some requests
    stop at end-of-generation, one asks for logprobs, one is cancelled."""
    engine = RecurrentCache(3, invariant)
    scheduler = Scheduler(engine, Metrics(), max_pending=16, prefill_chunk=4, state_checkpoints=saved)
    shared = [5, 9, 11, 2, 7, 3, 8, 1, 6]
    first = prompts(5, shared)
    waves = [
        [{"prompt": p, "max_tokens": 6 + i, "params": GREEDY} for i, p in enumerate(first)],
        [{"prompt": p + [4, 4, 2, 9, 1], "max_tokens": 8, "params": GREEDY} for p in first[:3]]
        + [{"prompt": first[3] + [3], "max_tokens": 5, "params": GREEDY, "job": {"top_logprobs": 1}}],
        [{"prompt": p, "max_tokens": 7, "params": GREEDY} for p in prompts(4, shared[:5])]
        + [{"prompt": first[4] + [2, 2], "max_tokens": 30, "params": GREEDY, "cancel_after": 2}],
        # next turns of the third wave's last three, one at a time (each in the slot it left): those
        # slots held the first waves' tokens before, and their saved states then
        *[
            [{"prompt": p + [6, 1, 1, 7], "max_tokens": 4, "params": GREEDY}]
            for p in prompts(4, shared[:5])[:0:-1]
        ],
    ]
    done = run_jobs(engine, scheduler, waves)
    check(engine, scheduler, done)
    assert engine.saves > 0
    resumed = [j.cached_tokens for j, _, _ in done[len(first) :]]
    assert sum(c > 0 for c in resumed) >= 4  # the later waves did resume saved states
    for job, _, _ in done:  # a saved state always sits where a chunk ends, or (invariant) a prompt does
        assert job.cached_tokens % 4 == 0 or invariant


def test_without_saved_states_a_recurrent_slot_only_continues_its_whole_sequence():
    engine = RecurrentCache(2, invariant_prefill=True)
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=4, state_checkpoints=0)
    base = [3, 1, 4, 1, 5, 9]
    waves = [
        [{"prompt": base, "max_tokens": 3, "params": SamplingParams(temperature=0.0)}],
        [{"prompt": base[:5] + [2, 6], "max_tokens": 3, "params": GREEDY}],
    ]
    done = run_jobs(engine, scheduler, waves)
    check(engine, scheduler, done)
    assert engine.saves == 0 and done[1][0].cached_tokens == 0


def test_a_slot_drops_the_states_saved_after_tokens_it_no_longer_holds():
    """One slot, room for 8 saved states: A (16 tokens) leaves states at 4, 8, 12 and 16; B shares none of
    A's tokens, so the slot starts again and saves its own (at 4 again among them); C shares B's first 5
    tokens and resumes at 4 with B's state, not A's."""
    engine = RecurrentCache(1, invariant_prefill=False)
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=4, state_checkpoints=8)
    a = list(range(1, 17))
    b = list(range(20, 38))
    waves = [[{"prompt": p, "max_tokens": 2, "params": GREEDY}] for p in (a, b, b[:5] + [7, 7, 7])]
    done = run_jobs(engine, scheduler, waves)
    check(engine, scheduler, done)
    assert [job.cached_tokens for job, _, _ in done] == [0, 0, 4]


def test_saved_states_stop_growing_where_memory_runs_out():
    """A device with room for two saved states (those alive, not yet dropped): the budget becomes the
    two that fit, every request still gets its greedy chain, and later states reuse those buffers."""

    class Held:  # a saved state that can be counted while alive
        def __init__(self, tokens: tuple[int, ...]):
            self.tokens = tokens

    class Scarce(RecurrentCache):
        alive: weakref.WeakSet = weakref.WeakSet()

        def save_state(self, slot: int, into=None) -> Held:
            if into is None and len(self.alive) >= 2:
                raise torch.OutOfMemoryError("no room")
            self.saves += 1
            held = into or Held(())
            held.tokens = self.state[slot]
            self.alive.add(held)
            return held

        def copy_prefix(self, source: int, target: int, length: int, state=None) -> None:
            super().copy_prefix(source, target, length, state.tokens)

    engine = Scarce(2, invariant_prefill=False)
    scheduler = Scheduler(engine, Metrics(), max_pending=8, prefill_chunk=4, state_checkpoints=8)
    shared = [5, 9, 11, 2, 7, 3, 8, 1, 6]
    waves = [[{"prompt": p, "max_tokens": 5, "params": GREEDY} for p in prompts(4, shared)] for _ in range(2)]
    done = run_jobs(engine, scheduler, waves)
    check(engine, scheduler, done)
    assert scheduler.prompt_cache.state_checkpoints == 2 and len(scheduler.prompt_cache.saved) == 2
    assert engine.saves > 2 and all(j.cached_tokens > 0 for j, _, _ in done[4:])

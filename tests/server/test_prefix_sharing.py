"""Cross-slot prefix reuse, the scheduler's arithmetic (a stand-in engine records its calls): prompts that
share a prefix are admitted together, the first computes each chunk of it and the others copy what it has
prefilled at their turn in the same step, copies costing no prefill budget. Where prefill is not
chunk-invariant (the GPU's cuBLAS) only whole chunks of prefilled tokens are copied, where it is (the
GPU's tiles, the CPU) any shared prefix (the last prompt token always evaluated), and a model with
recurrent state copies nothing. The expected calls are worked out by hand from the rules in
gufo.server.scheduler's docstring. And the prefix comparison it makes for every slot, against a plain loop."""

from __future__ import annotations

import asyncio
import random

import pytest

from gufo.engine.sampling import SamplingParams
from gufo.engine.speculative import common_prefix
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from tests.server.test_scheduler_rows import Logits

CHUNK = 8
SHARED = list(range(1, 21))  # 20 tokens: chunks 0-7 and 8-15 whole, 16-19 of the third
PROMPTS = [SHARED + [100 * i + j for j in range(4)] for i in range(3)]  # 24 tokens each


class Recorder(Logits):
    """("prefill", slot, start, tokens), ("copy", source, target, length), ("save", slot, length) and
    ("decode", rows). Without `rewindable` (recurrent state) a copy must come with the state the source
    saved when it held exactly `length` tokens."""

    def __init__(
        self, n_slots: int, invariant_prefill: bool, rewindable: bool = True, chunk_invariant: bool = False
    ):
        super().__init__(n_slots)
        self.invariant_prefill, self.rewindable = invariant_prefill, rewindable
        self.chunk_invariant = chunk_invariant
        self.calls: list[tuple] = []
        self.held = [0] * n_slots  # prompt tokens each slot has run

    def prefill(self, tokens, slot: int, start: int = 0):
        self.calls.append(("prefill", slot, start, len(tokens)))
        self.held[slot] = start + len(tokens)
        return super().prefill(tokens, slot, start)

    def copy_prefix(self, source: int, target: int, length: int, state=None) -> None:
        assert state == (None if self.rewindable else ("state", source, length))
        self.calls.append(("copy", source, target, length))
        self.held[target] = length

    def save_state(self, slot: int, into=None) -> tuple:
        assert not self.rewindable
        self.calls.append(("save", slot, self.held[slot]))
        return ("state", slot, self.held[slot])

    def decode_batch(self, tokens, positions, slots):
        self.calls.append(("decode", len(slots)))
        return super().decode_batch(tokens, positions, slots)


def run(
    engine: Recorder, prompts: list[list[int]], cache_prompt: bool = True, state_checkpoints: int = 1
) -> tuple[list[Job], Metrics]:
    """The prompts' greedy jobs of 2 tokens, all waiting before the worker's first step."""
    metrics = Metrics()
    scheduler = Scheduler(
        engine, metrics, len(prompts), prefill_chunk=CHUNK, state_checkpoints=state_checkpoints
    )
    greedy = SamplingParams(temperature=0.0)

    async def go() -> list[Job]:
        loop = asyncio.get_running_loop()
        jobs = [Job(p, 2, greedy, loop, cache_prompt=cache_prompt) for p in prompts]
        for job in jobs:
            scheduler.submit(job)
        scheduler.start()
        for job in jobs:
            while not isinstance(event := await job.events.get(), FinishEvent):
                pass
            assert event.reason == "length"
        return jobs

    try:
        jobs = asyncio.run(go())
    finally:
        scheduler.stop()
    return jobs, metrics


def test_without_batch_invariant_prefill_whole_chunks_of_a_shared_prefix_are_copied():
    engine = Recorder(3, invariant_prefill=False)
    jobs, metrics = run(engine, PROMPTS)
    assert engine.calls == [
        ("prefill", 0, 0, 8), ("copy", 0, 1, 8),  # step 1: the copy is free, the next chunk would pass
        ("prefill", 0, 8, 8), ("copy", 0, 1, 16),  # step 2
        ("prefill", 0, 16, 8),  # step 3: the chunk 16-23 holds other tokens past 19, job 1 computes it
        # step 4: job 2 copies what slot 1 holds already, then the step's chunks run
        ("copy", 1, 2, 16), ("prefill", 1, 16, 8), ("decode", 1),
        ("prefill", 2, 16, 8), ("decode", 1),  # step 5
        ("decode", 1),
    ]  # fmt: skip
    assert [j.cached_tokens for j in jobs] == [0, 16, 16]  # 20 shared, whole chunks of 8
    assert metrics.cached_tokens == 32
    assert metrics.prompt_tokens == 3 * 24


@pytest.mark.parametrize("invariant", ["batch", "chunk"])
def test_with_batch_or_chunk_invariant_prefill_the_whole_shared_prefix_is_copied(invariant):
    """Prompts share prefilled tokens only, so chunk invariance (the GPU's tiles) copies as much as batch
    invariance (the CPU: decoded tokens too)."""
    engine = Recorder(3, invariant_prefill=invariant == "batch", chunk_invariant=invariant == "chunk")
    jobs, metrics = run(engine, PROMPTS)
    assert engine.calls == [
        ("prefill", 0, 0, 8), ("copy", 0, 1, 8),
        ("prefill", 0, 8, 8), ("copy", 0, 1, 16),
        ("prefill", 0, 16, 8), ("copy", 0, 1, 20),  # the rest of job 1's chunk (4) would pass 0
        # 8 tokens: the step's chunks run after its copies (together where the engine packs them)
        ("copy", 1, 2, 20), ("prefill", 1, 20, 4), ("prefill", 2, 20, 4), ("decode", 1),
        ("decode", 2),
    ]  # fmt: skip
    assert [j.cached_tokens for j in jobs] == [0, 20, 20]
    assert metrics.cached_tokens == 40


def test_the_last_prompt_token_is_always_evaluated():
    engine = Recorder(2, invariant_prefill=True)
    jobs, _ = run(engine, [SHARED, SHARED])
    assert engine.calls[:4] == [
        ("prefill", 0, 0, 8), ("copy", 0, 1, 8), ("prefill", 0, 8, 8), ("copy", 0, 1, 16),
    ]  # fmt: skip
    assert ("copy", 0, 1, 19) in engine.calls and ("prefill", 1, 19, 1) in engine.calls
    assert [j.cached_tokens for j in jobs] == [0, 19]


@pytest.mark.parametrize("invariant", [False, True])
def test_a_model_with_recurrent_state_and_no_saved_states_copies_nothing(invariant):
    engine = Recorder(3, invariant_prefill=invariant, rewindable=False)
    jobs, metrics = run(engine, PROMPTS, state_checkpoints=0)
    assert not [c for c in engine.calls if c[0] in ("copy", "save")]
    assert sum(c[3] for c in engine.calls if c[0] == "prefill") == 3 * 24
    assert [j.cached_tokens for j in jobs] == [0, 0, 0] and metrics.cached_tokens == 0


def test_a_model_with_recurrent_state_copies_prefixes_where_a_slot_saved_its_state():
    """Three saved states per slot, taken where a chunk ends at a multiple of 8: the copies of the
    KV-only model's whole chunks, each from a state saved at that length (job 2 copies 16 from slot 0:
    slot 1 saved only 24)."""
    engine = Recorder(3, invariant_prefill=False, rewindable=False)
    jobs, metrics = run(engine, PROMPTS, state_checkpoints=3)
    assert engine.calls == [
        ("prefill", 0, 0, 8), ("save", 0, 8), ("copy", 0, 1, 8),  # step 1
        ("prefill", 0, 8, 8), ("save", 0, 16), ("copy", 0, 1, 16),  # step 2
        ("prefill", 0, 16, 8), ("save", 0, 24),  # step 3
        ("prefill", 1, 16, 8), ("save", 1, 24), ("copy", 0, 2, 16), ("decode", 1),  # step 4
        ("prefill", 2, 16, 8), ("save", 2, 24), ("decode", 1),  # step 5
        ("decode", 1),
    ]  # fmt: skip
    assert [j.cached_tokens for j in jobs] == [0, 16, 16] and metrics.cached_tokens == 32


def test_with_batch_invariant_prefill_a_recurrent_state_is_also_saved_at_the_prompts_end():
    """One saved state per slot, the latest: at a multiple of 8, or at the end of job 0's 20-token prompt,
    so job 1 (the same 20 tokens, then 4 of its own) copies 8 and 16 as slot 0 saves them, then all 20."""
    engine = Recorder(3, invariant_prefill=True, rewindable=False)
    jobs, _ = run(engine, [SHARED, PROMPTS[1]], state_checkpoints=1)
    assert engine.calls[:7] == [
        ("prefill", 0, 0, 8), ("save", 0, 8), ("copy", 0, 1, 8),
        ("prefill", 0, 8, 8), ("save", 0, 16), ("copy", 0, 1, 16),
        ("prefill", 0, 16, 4),  # the prompt's end, 20: saved (batch-invariant prefill)
    ]  # fmt: skip
    assert engine.calls[7] == ("save", 0, 20)
    assert ("copy", 0, 1, 20) in engine.calls  # job 1 shares all 20 and resumes after them
    assert [j.cached_tokens for j in jobs] == [0, 20]


def test_a_request_that_asks_for_no_cache_copies_nothing():
    engine = Recorder(2, invariant_prefill=True)
    jobs, _ = run(engine, PROMPTS[:2], cache_prompt=False)
    assert not [c for c in engine.calls if c[0] == "copy"]
    assert [j.cached_tokens for j in jobs] == [0, 0]


def test_common_prefix_counts_the_leading_tokens_two_sequences_share():
    rng = random.Random(0)
    for _ in range(2000):
        a = [rng.randrange(3) for _ in range(rng.randrange(40))]
        b = [rng.randrange(3) for _ in range(rng.randrange(40))]
        shared = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == common_prefix(tuple(a), b) == shared

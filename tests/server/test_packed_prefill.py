"""A scheduler step's prefill chunks go to the engine together (`Engine.prefill_parts`, which packs those it
can into one pass on a GPU): up to --prefill-batch tokens a step, the chunk a later job would copy from
computed before that copy, and a pass that fails retried chunk by chunk so that only the failing job
ends. A stand-in engine records the calls and hands out logits chosen by slot and position; the oracles
are the rules written out by hand and the greedy chain of those logits."""

from __future__ import annotations

import asyncio

import pytest

from gufo.engine.prompt_cache import PromptCache
from gufo.engine.sampling import SamplingParams
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from tests.server.test_prefix_sharing import Recorder
from tests.server.test_scheduler_rows import first_max, row_for

CHUNK = 8


class Packer(Recorder):
    """Records ("pass", ((slot, start, n_tokens), ...)) for each `prefill_parts` call; a part on slot
    `failing` makes the call raise."""

    def __init__(
        self,
        n_slots: int,
        failing: int | None = None,
        invariant_prefill: bool = True,
        chunk_invariant: bool = False,
    ):
        super().__init__(n_slots, invariant_prefill=invariant_prefill, chunk_invariant=chunk_invariant)
        self.failing = failing

    def packs_prefill(self, n_tokens: int) -> bool:
        return True

    def prefill_parts(self, parts) -> list:
        self.calls.append(("pass", tuple((p.slot, p.start, len(p.tokens)) for p in parts)))
        if any(p.slot == self.failing for p in parts):
            raise RuntimeError("a bad part")
        for part in parts:
            self.held[part.slot] = part.start + len(part.tokens)
        return [row_for(p.slot, p.start + len(p.tokens) - 1) for p in parts]

    def passes(self) -> list[tuple]:
        return [call[1] for call in self.calls if call[0] == "pass"]


def run(engine: Packer, prompts: list[list[int]], prefill_batch: int, max_tokens: int = 3) -> list[list]:
    """Each prompt's greedy job, all waiting before the worker's first step: (tokens, finish) each."""
    scheduler = Scheduler(engine, Metrics(), len(prompts), prefill_chunk=CHUNK, prefill_batch=prefill_batch)
    greedy = SamplingParams(temperature=0.0)

    async def go() -> list[list]:
        loop = asyncio.get_running_loop()
        jobs = [Job(p, max_tokens, greedy, loop) for p in prompts]
        for job in jobs:
            scheduler.submit(job)
        scheduler.start()
        results = []
        for job in jobs:
            tokens = []
            while not isinstance(event := await job.events.get(), FinishEvent):
                tokens.append(event.token)
            results.append([tokens, event])
        return results

    try:
        return asyncio.run(go())
    finally:
        scheduler.stop()


def greedy_chain(slot: int, prompt_length: int, count: int) -> list[int]:
    """The stand-in's greedy tokens for a job in `slot`: the first maximum of each position's row."""
    return [first_max(row_for(slot, prompt_length - 1 + i)) for i in range(count)]


def test_a_steps_chunks_share_one_call_up_to_the_prefill_batch():
    prompts = [[10 * i + j for j in range(1, 13)] for i in range(3)]  # 12 tokens: chunks of 8 and 4
    engine = Packer(3)
    results = run(engine, prompts, prefill_batch=20)
    assert engine.passes() == [
        ((0, 0, 8), (1, 0, 8)),  # 16 of 20: the third chunk (8) would pass the batch
        ((0, 8, 4), (1, 8, 4), (2, 0, 8)),  # 16
        ((2, 8, 4),),
    ]
    for slot, (tokens, finish) in enumerate(results):
        assert finish.reason == "length"
        assert tokens == greedy_chain(slot, 12, 3)


def test_a_chunk_that_a_later_job_copies_is_computed_before_the_copy():
    shared = list(range(1, 11))  # 10 tokens
    prompts = [shared + [100, 101, 102, 103], shared + [200, 201, 202, 203], list(range(300, 314))]
    engine = Packer(3)
    results = run(engine, prompts, prefill_batch=64)
    assert engine.calls[:3] == [
        ("pass", ((0, 0, 8),)),  # job 1 would copy from it: it runs before the copy
        ("copy", 0, 1, 8),
        ("pass", ((1, 8, 6), (2, 0, 8))),  # job 2 shares nothing: its chunk joins job 1's
    ]
    assert [tokens for tokens, _ in results] == [greedy_chain(slot, 14, 3) for slot in range(3)]


TEMPLATE_PROMPTS = [[1, 2, 3] + [10 * i + j for j in range(4, 13)] for i in range(1, 4)]  # 12 tokens each


@pytest.mark.parametrize(
    "invariant,chunk_invariant",
    [(False, False), (False, True), (True, False)],
    ids=["chunks", "chunk", "batch"],
)
def test_a_few_shared_first_tokens_do_not_split_the_call_where_chunks_share_it(invariant, chunk_invariant):
    """A chat template's first tokens in every prompt: where chunks share a prefill call, waiting for another
    job's pending chunk splits the call, which a job does for a whole chunk of shared tokens only
    (`PromptCache.chunk_adds`), whatever prefix reuse takes (whole chunks on cuBLAS, any prefilled prefix
    on the GPU's tiles, any prefix at all), so the step's chunks share one call."""
    engine = Packer(3, invariant_prefill=invariant, chunk_invariant=chunk_invariant)
    results = run(engine, TEMPLATE_PROMPTS, prefill_batch=64)
    assert engine.passes()[0] == ((0, 0, 8), (1, 0, 8), (2, 0, 8))
    assert [tokens for tokens, _ in results] == [greedy_chain(slot, 12, 3) for slot in range(3)]


def test_a_few_shared_first_tokens_are_copied_where_chunks_run_one_by_one():
    """Where chunks do not share calls (the CPU) and any prefix is reused, waiting costs nothing: the
    second job copies the template's tokens from the first job's chunk before its own."""
    engine = Recorder(3, invariant_prefill=True)
    run(engine, TEMPLATE_PROMPTS, prefill_batch=64)
    assert engine.calls[:2] == [("prefill", 0, 0, 8), ("copy", 0, 1, 3)]


def test_a_slot_that_holds_the_first_token_still_waits_for_the_chunk_that_brings_the_rest():
    """`PromptCache.chunk_adds` against what the slot can hand over now: a slot that kept one shared
    token (a BOS) from an earlier prompt hands over more only with its pending chunk, so that chunk runs
    before a job sharing 10 tokens copies; a job that shares only that token needs no chunk."""
    cache = PromptCache(Packer(2), CHUNK)
    cache.tokens[0], cache.prefilled[0] = [1], 1  # the slot kept the BOS of its last prompt
    chunk = [2, 3, 4, 5, 6, 7, 8]  # its job's next chunk: positions 1..7
    assert cache.chunk_adds(0, chunk, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], holds=0)
    assert not cache.chunk_adds(0, chunk, [1, 99, 3, 4, 5, 6, 7, 8, 9, 10], holds=0)
    assert not cache.chunk_adds(0, chunk, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], holds=8)  # has them all


@pytest.mark.parametrize("prefill_batch", [8, 64])
def test_a_failing_pass_fails_only_its_own_job(prefill_batch):
    prompts = [[10 * i + j for j in range(1, 7)] for i in range(3)]  # 6 tokens: one chunk each
    engine = Packer(3, failing=1)
    results = run(engine, prompts, prefill_batch=prefill_batch)
    alone = [((0, 0, 6),), ((1, 0, 6),), ((2, 0, 6),)]
    if prefill_batch == 64:  # the shared pass fails, then each chunk runs alone
        assert engine.passes() == [((0, 0, 6), (1, 0, 6), (2, 0, 6)), *alone]
    else:  # a chunk a step: nothing shares a call
        assert engine.passes() == alone
    assert [finish.reason for _, finish in results] == ["length", "error", "length"]
    assert results[0][0] == greedy_chain(0, 6, 3)
    assert results[2][0] == greedy_chain(2, 6, 3)

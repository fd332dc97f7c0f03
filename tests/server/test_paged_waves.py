"""Random waves of requests through the real Scheduler and smollm2 on a KV pool far smaller than its
sessions' contexts, with prefix reuse, the prefix store, short prefill chunks and cancellations: every
request's greedy tokens are the tokens the same request gets alone on an engine with the whole cache
(the oracle: a second engine, one slot, no reuse)."""

from __future__ import annotations

import asyncio
import random

import pytest

from gufo.engine.engine import Engine
from gufo.engine.params import SamplingParams
from gufo.options import RunOptions
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from tests.server.conftest import MODEL

GREEDY = SamplingParams(temperature=0.0)
SESSIONS, CONTEXT, CHUNK = 4, 256, 32
PAGE_BYTES = 30 * 3 * 64 * 128 * 4  # smollm2-135m's float32 KV page (tests/server/test_kv_memory.py)
Request = tuple[list[int], int, bool, bool]  # prompt, max_tokens, cache_prompt, cancelled after 2 tokens


def waves(seed: int, count: int) -> list[list[Request]]:
    """Prompts that start with parts of three shared prefixes (cut inside and at page ends), then their
    own tokens; max_tokens 1..39; half ask for reuse; about one in seven is cancelled."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 1000) for _ in range(length)] for length in (10, 70, 130)]

    def request() -> Request:
        prompt = rng.choice(prefixes)[: rng.choice([5, 64, 65, 128])]
        prompt = prompt + [rng.randrange(100, 1000) for _ in range(rng.randrange(1, 40))]
        return prompt, rng.randrange(1, 40), rng.random() < 0.5, rng.random() < 0.15

    return [[request() for _ in range(rng.randrange(1, 9))] for _ in range(count)]


async def run_wave(scheduler: Scheduler, wave: list[Request]) -> list[list[int]]:
    loop = asyncio.get_running_loop()
    jobs = [(Job(list(p), m, GREEDY, loop, cache_prompt=reuse), cancel) for p, m, reuse, cancel in wave]
    for job, _ in jobs:
        scheduler.submit(job)

    async def tokens_of(job: Job, cancel: bool) -> list[int]:
        tokens = []
        while not isinstance(event := await job.events.get(), FinishEvent):
            tokens.append(event.token)
            if cancel and len(tokens) == 2:
                scheduler.cancel(job)  # its handler stops listening, as the server's does
                return tokens
        assert event.reason != "error", event.error
        return tokens

    return await asyncio.gather(*(tokens_of(job, cancel) for job, cancel in jobs))


@pytest.fixture(scope="module")
def schedulers():
    tight = Engine(MODEL, RunOptions(threads=1), context=CONTEXT, n_slots=SESSIONS, kv_memory=6 * PAGE_BYTES)
    alone = Engine(MODEL, RunOptions(threads=1), context=CONTEXT, n_slots=1)
    pair = [Scheduler(e, Metrics(), max_pending=16, prefill_chunk=CHUNK) for e in (tight, alone)]
    for scheduler in pair:
        scheduler.start()
    yield pair
    for scheduler in pair:
        scheduler.stop()


def test_random_waves_on_a_tight_pool_keep_each_requests_tokens(schedulers):
    served, alone = schedulers
    assert served.engine.cache.total_pages == 6  # one context is 4 pages: at most one request and a half
    stored = 0
    for wave in waves(seed=2, count=4):
        got = asyncio.run(run_wave(served, wave))
        stored = max(stored, served.prompt_cache.stored_pages)
        for (prompt, max_tokens, _, cancel), tokens in zip(wave, got, strict=True):
            [want] = asyncio.run(run_wave(alone, [(prompt, max_tokens, False, False)]))
            assert tokens == (want[:2] if cancel else want), f"{len(prompt)} prompt tokens, {max_tokens} max"
    assert stored > 0  # the prefix store took part

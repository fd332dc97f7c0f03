"""Decode steps queued before the previous step's tokens are read (`Scheduler._decode`): every request
still gets the greedy chain of its own prompt, and a slot's cached tokens are always ones its cache
holds, through end-of-generation mid-step, max_tokens, cancellation, prefix reuse and rows that need
their logits on the host.

The stand-in engine keeps each slot's cache as the token written at each position and gives logits
that are a hash of the slot's tokens up to the one fed, so a token fed at a wrong position, a stale
cache entry or a reused prefix the slot does not hold changes the output. The oracle is the same hash
chained over the request's own prompt, in plain Python."""

from __future__ import annotations

import asyncio
import hashlib
from types import SimpleNamespace

import torch

from gufo.engine.sampling import SamplingParams
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from tests.server.conftest import PageAccounting

VOCAB, EOG = 40, 0


def logits_after(history: list[int]) -> list[float]:
    """Pseudo-random logits of the next token after `history`; end-of-generation wins after about one
    history in nine."""
    digest = hashlib.sha256(repr(history).encode()).digest()
    values = [float(digest[i % len(digest)] ^ (i * 37 % 251)) for i in range(VOCAB)]
    values[EOG] = 1000.0 if digest[0] % 9 == 0 else -1.0
    return values


def greedy_chain(prompt: list[int], max_tokens: int) -> list[int]:
    history, out = list(prompt), []
    while len(out) < max_tokens:
        values = logits_after(history)
        token = values.index(max(values))
        out.append(token)
        history.append(token)
        if token == EOG:
            break
    return out


class TokenCache(PageAccounting):
    """The Engine's side the scheduler uses, its KV entries the token ids themselves (one number per
    position, in a real paged cache): what a slot holds is read back from its pages, so a page shared,
    adopted from the prefix store or copied on write wrongly shows in the tokens and the logits."""

    invariant_prefill = rewindable = True

    def __init__(self, n_slots: int):
        super().__init__(n_slots)
        self.tokenizer = SimpleNamespace(eog_ids=frozenset({EOG}))
        self.lengths = [0] * n_slots  # per slot, how many positions it has written (or taken over)

    @property
    def slots(self) -> list[list[int]]:
        """Per slot, the token ids its pages hold at its positions."""
        return [
            self.cache.entries(0, slot, length)[0].flatten().long().tolist()
            for slot, length in enumerate(self.lengths)
        ]

    def _write(self, slot: int, start: int, tokens: list[int]) -> torch.Tensor:
        assert start <= self.lengths[slot], f"slot {slot}: writing at {start} past its {self.lengths[slot]}"
        self.cache.reserve(slot, start, start + len(tokens))
        ids = torch.tensor(tokens, dtype=torch.float32).view(-1, 1, 1)
        self.cache.append(0, slot, start, ids, ids)
        self.lengths[slot] = start + len(tokens)
        return torch.tensor(logits_after(self.slots[slot]))

    def prefill(self, tokens, slot: int, start: int = 0) -> torch.Tensor:
        return self._write(slot, start, list(tokens))

    def decode_batch(self, tokens, positions, slots) -> torch.Tensor:
        ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
        assert len(set(slots)) == len(slots)
        rows = [self._write(s, p, [t]) for t, p, s in zip(ids, positions, slots, strict=True)]
        return torch.stack(rows)

    def copy_prefix(self, source: int, target: int, length: int, state=None) -> None:
        assert state is None and length <= self.lengths[source]
        self.cache.copy_prefix(source, target, length)
        self.lengths[target] = length

    def adopt_pages(self, slot: int, pages) -> None:
        self.cache.adopt(slot, pages)
        self.lengths[slot] = len(pages) * self.cache.page_size


def run_jobs(engine: TokenCache, scheduler: Scheduler, waves: list[list[dict]]) -> list[tuple[Job, list]]:
    """Submit each wave's jobs together and wait for all of them; a job with `cancel_after` is cancelled
    once it has that many tokens (its handler then stops listening, as the server's does). Returns each
    job with its token ids."""

    async def run() -> list[tuple[Job, list]]:
        loop = asyncio.get_running_loop()
        done = []
        for wave in waves:
            jobs = [
                (Job(w["prompt"], w["max_tokens"], w["params"], loop, **w.get("job", {})), w) for w in wave
            ]
            for job, _ in jobs:
                scheduler.submit(job)
            for job, spec in jobs:
                tokens = []
                while not isinstance(event := await job.events.get(), FinishEvent):
                    tokens.append(event.token)
                    if len(tokens) == spec.get("cancel_after"):
                        scheduler.cancel(job)
                        break
                done.append((job, tokens, spec))
        await asyncio.to_thread(scheduler.stop)  # while the loop can still take a cancelled job's events
        return done

    scheduler.start()
    try:
        return asyncio.run(run())
    finally:
        scheduler.stop()


def check(engine: TokenCache, scheduler: Scheduler, done: list) -> None:
    for job, tokens, spec in done:
        expected = greedy_chain(job.prompt_ids, job.max_tokens)
        if "cancel_after" in spec:
            assert tokens == expected[: spec["cancel_after"]]
        else:
            assert tokens == expected, f"prompt {job.prompt_ids}"
    for slot, cached in enumerate(scheduler.prompt_cache.tokens):
        assert engine.slots[slot][: len(cached)] == cached, f"slot {slot} claims tokens it does not hold"


GREEDY = SamplingParams(temperature=0.0)


def prompts(count: int, shared: list[int]) -> list[list[int]]:
    return [shared + [1 + (7 * i + j) % (VOCAB - 1) for j in range(3 + i % 4)] for i in range(count)]


def test_queued_steps_give_each_request_its_own_greedy_chain():
    """Waves of greedy requests over 4 slots (more requests than slots), sharing prefixes with earlier
    waves: end-of-generation lands mid-step for some, max_tokens for others."""
    engine = TokenCache(4)
    scheduler = Scheduler(engine, Metrics(), max_pending=16, prefill_chunk=4)
    shared = [5, 9, 11, 2, 7, 3]
    waves = [
        [{"prompt": p, "max_tokens": 3 + i % 9, "params": GREEDY} for i, p in enumerate(prompts(6, shared))],
        [{"prompt": p, "max_tokens": 12, "params": GREEDY} for p in prompts(7, shared[:4])],
        [{"prompt": p, "max_tokens": 1 + i, "params": GREEDY} for i, p in enumerate(prompts(5, []))],
    ]
    done = run_jobs(engine, scheduler, waves)
    assert sum(t[-1:] == [EOG] for _, t, _ in done) >= 3  # the end-of-generation case really ran
    assert sum(len(t) == j.max_tokens and EOG not in t for j, t, _ in done) >= 3
    check(engine, scheduler, done)


def test_rows_that_need_the_host_and_cancelled_ones_among_queued_rows():
    """A logprobs row and a sampled row break the queue for the steps they are in; a cancelled job's
    queued token is dropped and its slot keeps only what it holds."""
    engine = TokenCache(4)
    scheduler = Scheduler(engine, Metrics(), max_pending=16, prefill_chunk=4)
    first, second = prompts(4, [3, 1, 4]), prompts(4, [3, 1, 4, 1])
    waves = [
        [
            {"prompt": first[0], "max_tokens": 10, "params": GREEDY},
            {"prompt": first[1], "max_tokens": 10, "params": GREEDY, "job": {"top_logprobs": 2}},
            {"prompt": first[2], "max_tokens": 20, "params": GREEDY, "cancel_after": 3},
            {"prompt": first[3], "max_tokens": 10, "params": SamplingParams(temperature=0.8, seed=3)},
        ],
        [{"prompt": p, "max_tokens": 9, "params": GREEDY} for p in second],
    ]
    done = run_jobs(engine, scheduler, waves)
    sampled = [d for d in done if not d[0].params.greedy]
    check(engine, scheduler, [d for d in done if d not in sampled])
    for job, tokens, _ in sampled:  # not the greedy chain; still only tokens its slot was fed
        assert 0 < len(tokens) <= job.max_tokens


def test_a_prompt_that_shares_nothing_leaves_the_cached_prefixes_alone():
    """Two slots, one holding a finished request's tokens: a prompt sharing nothing with it takes the
    empty slot, so the next prompt that extends the first still finds all of it cached."""
    engine = TokenCache(2)
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=4)
    first, other = [5, 9, 11, 2, 7, 3, 8, 1], [4, 4, 6]
    waves = [
        [{"prompt": first, "max_tokens": 1, "params": GREEDY}],
        [{"prompt": other, "max_tokens": 1, "params": GREEDY}],
        [{"prompt": first + [6, 2], "max_tokens": 2, "params": GREEDY}],
    ]
    done = run_jobs(engine, scheduler, waves)
    check(engine, scheduler, done)
    assert done[1][0].slot != done[0][0].slot and done[2][0].cached_tokens == len(first)


def test_a_prefix_outlives_the_slot_that_computed_it():
    """One slot: a prompt, then one sharing nothing (the slot starts over), then the first extended: its
    three whole pages of 4 come back from the prefix store, and the slot holds what it claims."""
    engine = TokenCache(1)
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=4)
    first = [5, 9, 11, 2, 7, 3, 8, 1, 6, 6, 2, 4]
    waves = [
        [{"prompt": first, "max_tokens": 1, "params": GREEDY}],
        [{"prompt": [4, 4, 6], "max_tokens": 1, "params": GREEDY}],
        [{"prompt": first + [6, 2], "max_tokens": 2, "params": GREEDY}],
    ]
    done = run_jobs(engine, scheduler, waves)
    check(engine, scheduler, done)
    assert [job.cached_tokens for job, _, _ in done] == [0, 0, 12]


def test_a_closed_event_loop_stops_no_other_generation():
    """A job's events can reach its event loop after the loop has closed (a library caller's
    `asyncio.run` that returned before the job ended): they go nowhere, and the next loop's jobs get
    their tokens."""
    engine = TokenCache(2)
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=4)
    first = next(p for p in prompts(9, [3, 1, 4]) if EOG not in greedy_chain(p, 30))  # runs all 30 steps
    second = prompts(2, [2, 7])[1]

    async def first_token_only() -> int:
        job = Job(first, 30, GREEDY, asyncio.get_running_loop())
        scheduler.submit(job)
        return (await job.events.get()).token  # the loop closes with 29 tokens still to come

    async def complete() -> list[int]:
        job = Job(second, 8, GREEDY, asyncio.get_running_loop())
        scheduler.submit(job)
        tokens = []
        while not isinstance(event := await job.events.get(), FinishEvent):
            tokens.append(event.token)
        return tokens

    scheduler.start()
    try:
        assert asyncio.run(first_token_only()) == greedy_chain(first, 1)[0]
        # (a dead worker would never answer: a timeout, not a hang)
        assert asyncio.run(asyncio.wait_for(complete(), 60)) == greedy_chain(second, 8)
        assert scheduler.alive
    finally:
        scheduler.stop()

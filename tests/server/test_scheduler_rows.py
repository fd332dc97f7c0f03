"""A batched decode step's rows: plainly greedy ones get their token where the logits are, a greedy row
that follows a grammar (a real xgrammar one) gets its best allowed token from the batch's masked rows,
and a row among them that asks for logprobs or samples still gets its whole logit row (a stand-in engine
hands out known logits; the oracles are plain float64 arithmetic on them)."""

from __future__ import annotations

import asyncio
import math
import string
from types import SimpleNamespace

import torch
import xgrammar

from gufo.engine.constraint import TokenConstraint
from gufo.engine.sampling import SamplingParams
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from tests.server.conftest import PageAccounting

VOCAB, TOKENS = 50, 4


def row_for(slot: int, position: int) -> torch.Tensor:
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(1000 * slot + position))
    logits[(slot + position) % VOCAB] = logits[(slot + 7 * position) % VOCAB] = 5.0  # a tie
    return logits


class Logits(PageAccounting):
    """The Engine's side the scheduler uses, with logits chosen by slot and position."""

    invariant_prefill = rewindable = True

    def __init__(self, n_slots: int):
        super().__init__(n_slots)
        self.tokenizer = SimpleNamespace(eog_ids=frozenset())

    def prefill(self, tokens, slot: int, start: int = 0) -> torch.Tensor:
        return row_for(slot, start + len(tokens) - 1)

    def decode_batch(self, tokens, positions, slots) -> torch.Tensor:
        return torch.stack([row_for(s, p) for p, s in zip(positions, slots, strict=True)])

    def copy_prefix(self, source: int, target: int, length: int, state=None) -> None:
        pass  # the logits depend on slot and position alone


ALLOWED = list(range(0, VOCAB, 3))  # the grammar's tokens: every third id


def every_third() -> TokenConstraint:
    """A real grammar (xgrammar) over a vocabulary of one letter per id that allows only ALLOWED."""
    letters = string.ascii_letters[:VOCAB]
    info = xgrammar.TokenizerInfo([c.encode() for c in letters], vocab_size=VOCAB, stop_token_ids=[])
    chars = "".join(letters[i] for i in ALLOWED)
    grammar = xgrammar.GrammarCompiler(info, max_threads=1).compile_grammar(f"root ::= [{chars}]*")
    return TokenConstraint(grammar, VOCAB)


def first_max(row: torch.Tensor) -> int:
    values = row.tolist()
    return values.index(max(values))


def first_allowed_max(row: torch.Tensor) -> int:
    values = row.tolist()
    return max(ALLOWED, key=lambda i: (values[i], -i))


def test_rows_that_need_logits_get_them_whole_among_greedy_rows():
    greedy = SamplingParams(temperature=0.0)
    scheduler = Scheduler(Logits(4), Metrics(), max_pending=4)
    scheduler.start()

    async def run() -> list[list]:
        loop = asyncio.get_running_loop()
        prompt = [1, 2, 3]
        jobs = [
            Job(prompt, TOKENS, greedy, loop),
            Job(prompt, TOKENS, greedy, loop, top_logprobs=3),
            Job(prompt, TOKENS, greedy, loop, constraint=every_third()),
            Job(prompt, TOKENS, SamplingParams(temperature=1.0, seed=5), loop, top_logprobs=0),
        ]
        for job in jobs:
            scheduler.submit(job)
        events = []
        for job in jobs:
            got = []
            while not isinstance(event := await job.events.get(), FinishEvent):
                got.append(event)
            assert event.reason == "length"
            events.append(got)
        return jobs, events

    try:
        jobs, events = asyncio.run(run())
    finally:
        scheduler.stop()
    for job, got in zip(jobs, events, strict=True):
        rows = [row_for(job.slot, len(job.prompt_ids) - 1 + i) for i in range(TOKENS)]
        tokens = [e.token for e in got]
        if job.params.greedy:  # the grammar's row masked in the batch: its best allowed token
            assert tokens == [first_allowed_max(r) if job.constraint else first_max(r) for r in rows]
        if job.top_logprobs is not None:  # the whole row: float64 log-softmax by hand
            for event, row in zip(got, rows, strict=True):
                values = [float(v) for v in row]
                top = max(values)
                norm = top + math.log(sum(math.exp(v - top) for v in values))
                assert math.isclose(event.logprob, values[event.token] - norm, rel_tol=1e-5, abs_tol=1e-6)
                top_ids = [t for t, _ in event.top or []]  # the tie's order is topk's
                assert len(top_ids) == job.top_logprobs
                assert sorted(values[t] for t in top_ids) == sorted(values)[VOCAB - job.top_logprobs :]
                for t, logprob in event.top or []:
                    assert math.isclose(logprob, values[t] - norm, rel_tol=1e-5, abs_tol=1e-6)
        else:
            assert all(e.logprob is None for e in got)
    assert all(t in ALLOWED for t in [e.token for e in events[2]])


class CallLog(Logits):
    """Logits that also records the engine calls: ("prefill", slot, tokens) and ("decode", rows)."""

    def __init__(self, n_slots: int):
        super().__init__(n_slots)
        self.calls: list[tuple] = []

    def prefill(self, tokens, slot: int, start: int = 0) -> torch.Tensor:
        self.calls.append(("prefill", slot, len(tokens)))
        return super().prefill(tokens, slot, start)

    def decode_batch(self, tokens, positions, slots) -> torch.Tensor:
        self.calls.append(("decode", len(slots)))
        return super().decode_batch(tokens, positions, slots)


def test_a_step_prefills_waiting_prompts_up_to_one_chunk_of_tokens():
    """--prefill-chunk tokens per step over the waiting prompts in turn (the step's first chunk always),
    each prompt in its own chunks: prompts of 3, 3, 3 and 10 tokens under a chunk of 8, 2 tokens each.
    A step decodes the rows that had their first token when it began."""
    engine = CallLog(4)
    scheduler = Scheduler(engine, Metrics(), max_pending=4, prefill_chunk=8)
    greedy = SamplingParams(temperature=0.0)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        # prompts that share no prefix: nothing is copied from slot to slot
        jobs = [Job(list(range(100 * i, 100 * i + n)), 2, greedy, loop) for i, n in enumerate((3, 3, 3, 10))]
        for job in jobs:
            scheduler.submit(job)  # all waiting before the worker's first step
        scheduler.start()
        for job in jobs:
            while not isinstance(await job.events.get(), FinishEvent):
                pass

    try:
        asyncio.run(run())
    finally:
        scheduler.stop()
    assert engine.calls == [
        ("prefill", 0, 3), ("prefill", 1, 3),  # step 1: 6 of 8 tokens; the third prompt's 3 would pass 8
        ("prefill", 2, 3), ("decode", 2),  # step 2: the 10-token prompt's first chunk (8) would pass 5
        ("prefill", 3, 8), ("decode", 1),  # step 3: a step's first chunk runs whatever its size
        ("prefill", 3, 2), ("decode", 1),  # step 4: the prompt's second chunk; step 5 its first decode
    ]  # fmt: skip

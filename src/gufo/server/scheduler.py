"""Scheduler: N KV slots, a bounded queue, continuous batching, cancellation and prefix reuse.

The engine is not thread-safe, so one worker thread owns it. Each step it drops cancelled jobs,
admits waiting ones into free slots, runs one prefill chunk (so a long prompt does not stall the
running streams) and then one batched decode step for every job that has a token to feed. Tokens go
back to the request handlers through their asyncio queues.

With speculation each decoding job instead runs its slot's Speculator: a draft after its context and
one verification pass of the pending token and the draft, whose tokens are posted one by one until
the job ends (end-of-generation, a stop id or max_tokens), so nothing past its end is ever posted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from gufo.runtime.engine import Engine
from gufo.runtime.sampling import Sampler, SamplingParams
from gufo.runtime.speculative import SpeculativeStats, Speculator
from gufo.server.metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_PREFILL_CHUNK = 512


class QueueFullError(Exception):
    """Every slot is busy and the queue holds `max_pending` jobs."""


@dataclass
class TokenEvent:
    token: int
    time: float  # perf_counter when it was sampled
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None  # (id, logprob), most likely first


@dataclass
class FinishEvent:
    reason: str  # "stop" (end-of-generation or stop id), "length" or "error"
    error: str | None = None


@dataclass(eq=False)
class Job:
    """One generation request, from submission until its slot is freed."""

    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    stop_ids: frozenset[int] = frozenset()
    top_logprobs: int | None = None  # None: no logprobs; 0: only the sampled token's
    cache_prompt: bool = True
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted_at: float = field(default_factory=time.perf_counter)
    # Written by the scheduler thread before the token events that make them meaningful.
    cached_tokens: int = 0
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    slot: int | None = None
    sampler: Sampler | None = None
    prefilled: int = 0
    generated: list[int] = field(default_factory=list)
    cancelled: bool = False
    drafted: int = 0  # speculative draft tokens verified for this job, and how many were kept
    accepted: int = 0

    @property
    def prompt_seconds(self) -> float:
        return self.first_token_at - self.admitted_at

    def post(self, event: TokenEvent | FinishEvent) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        max_pending: int,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        speculators: list[Speculator] | None = None,
    ):
        """`speculators`: one per KV slot (its proposer state belongs to that slot), or None."""
        self.engine = engine
        self.speculators = speculators
        self.metrics = metrics
        self.max_pending = max_pending
        self.prefill_chunk = prefill_chunk
        self.n_slots = engine.cache.n_slots
        self.eog_ids = engine.tokenizer.eog_ids
        self.slot_tokens: list[list[int]] = [[] for _ in range(self.n_slots)]  # ids whose KV is valid
        self.active: dict[int, Job] = {}  # slot -> job, in admission order
        self.waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="gufo-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def submit(self, job: Job) -> None:
        with self._cond:
            if len(self.active) + len(self.waiting) >= self.n_slots + self.max_pending:
                raise QueueFullError(
                    f"all {self.n_slots} sessions are busy and {self.max_pending} requests are queued"
                )
            self.waiting.append(job)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job; its slot is freed at the next step. Harmless once it has finished."""
        with self._cond:
            job.cancelled = True
            self._cond.notify()

    def gauges(self) -> dict[str, int]:
        with self._cond:
            return {
                "gufo_requests_active": len(self.active),
                "gufo_queue_depth": len(self.waiting),
                "gufo_sessions": self.n_slots,
            }

    # ---- worker thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self.active and not self.waiting:
                    self._cond.wait()
                if self._stopping:
                    return
                self._drop_cancelled()
                self._admit()
            try:
                self._step()
            except Exception as err:  # an engine failure fails the jobs in flight, not the server
                log.exception("generation step failed")
                with self._cond:
                    for slot, job in list(self.active.items()):
                        self.slot_tokens[slot] = []  # the KV state is unknown now
                        self._finish(job, FinishEvent("error", f"generation failed: {err}"))

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            self.metrics.finish("cancelled")
        for job in [j for j in self.active.values() if j.cancelled]:
            self._release(job)
            self.metrics.finish("cancelled")

    def _admit(self) -> None:
        free = [s for s in range(self.n_slots) if s not in self.active]
        while free and self.waiting:
            job = self.waiting.popleft()
            prompt = job.prompt_ids
            if job.cache_prompt:
                slot = max(free, key=lambda s: common_prefix(self.slot_tokens[s], prompt))
                # At least the last prompt token is evaluated: its logits give the first token.
                reused = min(common_prefix(self.slot_tokens[slot], prompt), len(prompt) - 1)
                if reused < len(self.slot_tokens[slot]) and not self.engine.rewindable:
                    reused = 0  # a recurrent state only continues the whole sequence it holds
            else:  # leave the most valuable cached prefixes to other requests
                slot = min(free, key=lambda s: len(self.slot_tokens[s]))
                reused = 0
            free.remove(slot)
            del self.slot_tokens[slot][reused:]
            job.slot, job.prefilled, job.cached_tokens = slot, reused, reused
            job.admitted_at = time.perf_counter()
            self.active[slot] = job
            job.sampler = Sampler(job.params)
            self.metrics.admitted(len(prompt), reused)

    def _step(self) -> None:
        jobs = list(self.active.values())
        decoding = [j for j in jobs if j.generated]
        prefilling = next((j for j in jobs if not j.generated), None)
        if prefilling is not None:
            self._prefill_chunk(prefilling)
        if self.speculators is not None:
            for job in decoding:
                self._speculate(job)
        elif decoding:
            logits = self.engine.decode_batch(
                [j.generated[-1] for j in decoding],
                [len(j.prompt_ids) + len(j.generated) - 1 for j in decoding],
                [j.slot for j in decoding],
            )
            for job, row in zip(decoding, logits, strict=True):
                self.slot_tokens[job.slot].append(job.generated[-1])
                self._sample(job, row)

    def _prefill_chunk(self, job: Job) -> None:
        chunk = job.prompt_ids[job.prefilled : job.prefilled + self.prefill_chunk]
        logits = self.engine.prefill(chunk, job.slot, start=job.prefilled)
        job.prefilled += len(chunk)
        self.slot_tokens[job.slot].extend(chunk)
        if job.prefilled == len(job.prompt_ids):
            self._sample(job, logits)

    def _speculate(self, job: Job) -> None:
        """One verification pass of the job's pending token and a draft; its tokens are posted until the
        job ends. The cache then holds every posted token but the last (kept drafts were computed)."""
        history = job.prompt_ids + job.generated
        stats = SpeculativeStats()
        speculator = self.speculators[job.slot]
        rows, tokens = speculator.step(
            history, job.max_tokens - len(job.generated), job.sampler, job.slot, stats
        )
        self.slot_tokens[job.slot].append(history[-1])
        posted: list[int] = []
        for index, token in enumerate(tokens):
            history.append(token)
            posted.append(token)
            if self._post(job, token, rows[index]):
                break
        self.slot_tokens[job.slot].extend(posted[:-1])
        self.engine.keep_tokens(job.slot, len(posted))
        job.drafted += stats.drafted
        job.accepted += stats.accepted
        self.metrics.speculated(stats.drafted, stats.accepted)

    def _sample(self, job: Job, logits: torch.Tensor) -> None:
        self._post(job, job.sampler(logits, job.prompt_ids + job.generated), logits)

    def _post(self, job: Job, token: int, logits: torch.Tensor) -> bool:
        """Send a token (sampled from `logits`) to the job's handler; True when the job ends with it."""
        now = time.perf_counter()
        event = TokenEvent(token, now)
        if job.top_logprobs is not None:
            logprobs = torch.log_softmax(logits.float(), -1)
            event.logprob = float(logprobs[token])
            if job.top_logprobs:
                values, ids = torch.topk(logprobs, job.top_logprobs)
                event.top = list(zip(ids.tolist(), values.tolist(), strict=True))
        if job.generated:
            self.metrics.token(None, now - job.last_token_at)
        else:
            job.first_token_at = now
            self.metrics.token(now - job.submitted_at, None)
        job.generated.append(token)
        job.last_token_at = now
        job.post(event)
        if token in self.eog_ids or token in job.stop_ids:
            self._finish(job, FinishEvent("stop"))
        elif len(job.generated) >= job.max_tokens:
            self._finish(job, FinishEvent("length"))
        else:
            return False
        return True

    def _finish(self, job: Job, event: FinishEvent) -> None:
        self._release(job)
        job.post(event)
        self.metrics.finish(event.reason)

    def _release(self, job: Job) -> None:
        with self._cond:  # `submit` and `gauges` read `active` from other threads
            del self.active[job.slot]

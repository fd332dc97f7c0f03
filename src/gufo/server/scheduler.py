"""Scheduler: N KV slots, a bounded queue, continuous batching, cancellation and prefix reuse.

The engine is not thread-safe, so one worker thread owns it. Each step it drops cancelled jobs,
admits waiting ones into free slots, prefills the next chunk of waiting prompts up to `prefill_batch`
tokens (so a long prompt does not stall the running streams; the engine packs those chunks into one
pass where it can, `Engine.prefill_parts`) and then runs one batched decode step for every job that has
a token to feed. Tokens go
back to the request handlers through their asyncio queues, each loop's events of a step in one wake-up.
The decode step's logits stay on the engine's device: plainly greedy rows take their token there, only
the rows a Sampler or logprobs need come to the host (`greedy_split`).

With speculation each decoding job instead runs its slot's Speculator: a draft after its context and
one verification pass of the pending token and the draft, whose tokens are posted one by one until
the job ends (end-of-generation, a stop id or max_tokens), so nothing past its end is ever posted.

A request's output depends on the request alone, never on what else runs or was cached: which prefix
of a prompt a slot can reuse, and which recurrent states are saved for that, is the engine's
`PromptCache` rule (gufo.engine.prompt_cache), chunks of `prefill_chunk` at absolute positions.

A request reuses such a prefix from any slot, free or running, not only the one it is admitted into:
before each of its prefill chunks it copies the KV of the longest one another slot holds
(`Engine.copy_prefix`; with recurrent state, one another slot saved its state after). Jobs take their
chunks in admission order, so among prompts that share a prefix the first computes each chunk of it and
the others copy that chunk at their turn in the same step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch

from gufo.engine.constraint import BatchMasker, TokenConstraint
from gufo.engine.engine import Engine, PrefillPart
from gufo.engine.prompt_cache import PromptCache
from gufo.engine.sampling import QueuedTokens, Sampler, SamplingParams, first_max_queued, greedy_split
from gufo.engine.speculative import SpeculativeStats, Speculator, common_prefix
from gufo.server.metrics import Metrics
from gufo.server.settings import DEFAULT_PREFILL_BATCH, DEFAULT_PREFILL_CHUNK

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """Every slot is busy and the queue holds `max_pending` jobs."""


class WorkerDeadError(Exception):
    """The worker thread has stopped; nothing more can be generated."""


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
    status: int = 500  # the HTTP status of an error: 500, or 503 when the server is shutting down
    code: str | None = None  # OpenAI's error code


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
    constraint: TokenConstraint | None = None  # the request's grammar, its own parse state
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
    cancelled: str | None = None  # why the handler ended it early: "cancelled", or "stop" (a stop string)
    drafted: int = 0  # speculative draft tokens verified for this job, and how many were kept
    accepted: int = 0

    @property
    def prompt_seconds(self) -> float:
        return self.first_token_at - self.admitted_at


class Outbox:
    """Events for the handlers' queues, sent by `flush`: one `call_soon_threadsafe` per event loop per
    step, not one per token (each writes the loop's wake-up pipe and, on a busy server, hands the GIL
    to the loop's thread; docs/decisions.md, "Server: the host side of a decode step")."""

    def __init__(self) -> None:
        self._events: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, object]]] = {}

    def add(self, job: Job, event: TokenEvent | FinishEvent) -> None:
        self._events.setdefault(job.loop, []).append((job.events, event))

    def flush(self) -> None:
        events, self._events = self._events, {}
        for loop, items in events.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                if not loop.is_closed():
                    raise
                # nobody can wait on a closed loop's queues (its caller has returned): the events go
                # nowhere, and the other jobs' generation goes on
                log.debug("dropped %d events of a closed event loop", len(items))


def _deliver(items: list[tuple[asyncio.Queue, object]]) -> None:
    for queue, event in items:
        queue.put_nowait(event)


@dataclass
class Queued:
    """A decode step queued on the device whose greedy tokens the host has not read yet."""

    jobs: list[Job]  # its rows
    tokens: QueuedTokens


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        metrics: Metrics,
        max_pending: int,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        speculators: list[Speculator] | None = None,
        state_checkpoints: int | None = None,
        prefill_batch: int | None = None,
    ):
        """`speculators`: one per KV slot (its proposer state belongs to that slot), or None.
        `state_checkpoints`: with recurrent state, how many saved states the slots keep in all (0: none;
        None: as many as there are slots). `prefill_batch`: prompt tokens a step prefills over the waiting
        prompts (None: DEFAULT_PREFILL_BATCH where the engine packs several prompts' chunks into one
        pass, `Engine.packs_prefill`, else one chunk's worth)."""
        self.engine = engine
        self.speculators = speculators
        self.metrics = metrics
        self.max_pending = max_pending
        self.prefill_chunk = prefill_chunk
        if prefill_batch is None:
            packs = engine.packs_prefill(prefill_chunk)
            prefill_batch = max(prefill_chunk, DEFAULT_PREFILL_BATCH) if packs else prefill_chunk
        self.prefill_batch = prefill_batch
        self.n_slots = engine.cache.n_slots
        self.eog_ids = engine.tokenizer.eog_ids
        self.prompt_cache = PromptCache(engine, prefill_chunk, state_checkpoints)  # what each slot holds
        self.active: dict[int, Job] = {}  # slot -> job, in admission order
        self.last_used = [0.0] * self.n_slots  # per slot, when its last job ended (the cache's LRU order)
        self.waiting: deque[Job] = deque()
        self._calls: deque[tuple[Callable[[], object], concurrent.futures.Future]] = deque()  # see `call`
        self._cond = threading.Condition()
        self._stopping = False
        self._aborting: FinishEvent | None = None  # set by `abort`: the event every job gets
        self._outbox = Outbox()  # the events of this step (worker thread only)
        self._masker: BatchMasker | None = None  # made at the first constrained decode step
        self._queued: Queued | None = None  # the last decode step, while its tokens are on the device
        self.failure: str | None = None  # why the worker stopped, once it has
        self._thread = threading.Thread(target=self._run, name="gufo-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self.failure is None

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self.failure is not None:
                raise WorkerDeadError(f"the generation worker has stopped: {self.failure}")
            if len(self.active) + len(self.waiting) >= self.n_slots + self.max_pending:
                raise QueueFullError(
                    f"all {self.n_slots} sessions are busy and {self.max_pending} requests are queued"
                )
            self.waiting.append(job)
            self._cond.notify()

    def call(self, work: Callable[[], object]) -> concurrent.futures.Future:
        """Run `work` on the worker thread between two steps (the engine is not thread-safe): its result
        or exception in the future returned. For engine work outside the slots (embeddings)."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self.failure is not None:
                raise WorkerDeadError(f"the generation worker has stopped: {self.failure}")
            self._calls.append((work, future))
            self._cond.notify()
        return future

    def cancel(self, job: Job, reason: str = "cancelled") -> None:
        """Stop a job; its slot is freed at the next step and `reason` counted in the metrics (the first
        reason given wins). Harmless once it has finished."""
        with self._cond:
            job.cancelled = job.cancelled or reason
            self._cond.notify()

    def abort(self, message: str) -> None:
        """End every waiting and running job, and any submitted later, with a 503 error `message`
        (code shutting_down): the shutdown timeout has passed."""
        with self._cond:
            self._aborting = FinishEvent("error", message, status=503, code="shutting_down")
            self._cond.notify()

    def gauges(self) -> dict[str, int]:
        with self._cond:
            return {
                "gufo_requests_active": len(self.active),
                "gufo_queue_depth": len(self.waiting),
                "gufo_sessions": self.n_slots,
                "gufo_kv_pages": self.engine.cache.total_pages,
                "gufo_kv_pages_free": self.engine.cache.free_pages,
                "gufo_kv_pages_stored": self.prompt_cache.stored_pages,
                "gufo_worker_up": int(self.alive),
            }

    # ---- worker thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # the loop itself broke: fail everything and say so
            log.exception("the generation worker stopped")
            with self._cond:
                self.failure = f"{type(err).__name__}: {err}"
                self._fail_all(FinishEvent("error", f"the generation worker stopped: {self.failure}"))
            self._outbox.flush()

    def _loop(self) -> None:
        while True:
            self._outbox.flush()  # what the last iteration (a step, an abort, a failed admission) sent
            with self._cond:
                while not self._stopping and not self.active and not self.waiting and not self._calls:
                    self._cond.wait()
                if self._stopping:
                    return
                if self._aborting is not None:
                    self._fail_all(self._aborting)
                    continue
                self._drop_cancelled()
                self._admit()
                calls = list(self._calls)
                self._calls.clear()
            for work, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(work())
                    except Exception as err:  # the caller's failure, not the worker's
                        future.set_exception(err)
            self._step()

    def _fail_all(self, event: FinishEvent) -> None:
        for _, future in self._calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(WorkerDeadError(event.error or "the generation worker stopped"))
        self._calls.clear()
        for job in self.waiting:
            self._outbox.add(job, event)
            self.metrics.finish(event.reason)
        self.waiting.clear()
        for job in list(self.active.values()):
            self.prompt_cache.truncate(job.slot, 0, keep_pages=False)
            self._finish(job, event)

    def _fail(self, job: Job, err: Exception) -> None:
        """End one job with a 500; its slot's KV state is unknown now, so its cached prefix goes."""
        self.prompt_cache.truncate(job.slot, 0, keep_pages=False)
        self._finish(job, FinishEvent("error", f"generation failed: {err}"))

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.waiting if j.cancelled]:
            self.waiting.remove(job)
            self.metrics.finish(job.cancelled)
        for job in [j for j in self.active.values() if j.cancelled]:
            self._release(job)
            self.metrics.finish(job.cancelled)

    def _admit(self) -> None:
        """Admit waiting jobs in order into free slots while the KV cache has the pages each needs
        (`_make_room`); the first that does not fit waits, and those behind it, for running jobs to end."""
        free = [s for s in range(self.n_slots) if s not in self.active]
        cache = self.prompt_cache
        while free and self.waiting:
            job = self.waiting[0]
            prompt = job.prompt_ids
            if job.cache_prompt and self.engine.rewindable:
                # among slots that share as much, the one holding least: the others' prefixes stay cached
                slot = max(
                    free, key=lambda s: (common_prefix(cache.tokens[s], prompt), -len(cache.tokens[s]))
                )
                reused = cache.reusable(slot, prompt)
            elif job.cache_prompt:  # the whole sequence a slot holds, else its longest saved state within
                resumable = {s: cache.resumable(s, prompt) for s in free}
                slot = max(free, key=lambda s: (resumable[s], -len(cache.tokens[s])))
                reused = resumable[slot]
            else:  # leave the most valuable cached prefixes to other requests
                slot = min(free, key=lambda s: len(cache.tokens[s]))
                reused = 0
            if not self._make_room(job, slot, reused):
                return
            self.waiting.popleft()
            free.remove(slot)
            job.slot, job.prefilled, job.cached_tokens = slot, reused, reused
            job.admitted_at = time.perf_counter()
            self.active[slot] = job
            self.metrics.admitted(len(prompt), reused)
            try:
                cache.take(slot, reused)
                job.sampler = Sampler(job.params, prompt_length=len(prompt), constraint=job.constraint)
            except Exception as err:  # e.g. a seed torch refuses: this request fails, not the worker
                log.exception("admitting a request failed")
                self._fail(job, err)

    def _pages_of_job(self, job: Job) -> int:
        """KV pages a job's whole sequence may take from the pool: its prompt and max_tokens (within the
        context), and one copy of a page it shares where it starts writing (`KVCache.reserve`)."""
        kv = self.engine.cache
        end = min(self.engine.context, len(job.prompt_ids) + job.max_tokens)
        return min(kv.pages_per_slot, kv.pages_of(end) + 1)

    def _make_room(self, job: Job, slot: int, reused: int) -> bool:
        """Whether the pool can give `job`, in `slot` after its first `reused` cached tokens, every page
        its sequence may take while the running jobs take theirs (each was promised its whole sequence at
        admission, so none ever runs out), counting the pages only the prefix store holds as free; it
        hands idle slots' cached prefixes to the store, least recently used first, until it can. A
        request then never fails for want of KV memory: it waits."""
        kv = self.engine.cache
        needed = self._pages_of_job(job) - kv.pages_of(reused)
        promised = sum(max(0, self._pages_of_job(j) - len(kv.held[j.slot])) for j in self.active.values())
        # the pages the slot gives back when it keeps only the reused prefix, where no other slot has them
        given_back = sum(kv.refs[page] == 1 for page in kv.held[slot][kv.pages_of(reused) :])
        idle = sorted(
            (s for s in range(self.n_slots) if s != slot and s not in self.active and kv.held[s]),
            key=lambda s: self.last_used[s],
        )

        def room() -> int:  # pages only the prefix store holds are free for the asking (`KVCache.reclaim`)
            return kv.free_pages + self.prompt_cache.reclaimable() + given_back - promised

        while room() < needed and idle:
            self.prompt_cache.truncate(idle.pop(0), 0)  # its pages go to the store
        return room() >= needed

    def _copy_prefix(self, job: Job) -> None:
        """Copy into the job's slot the longest reusable prefix of its prompt that another slot holds,
        free or active, or that the prefix store keeps (`PromptCache.stored`), when that is more than
        the job has prefilled; the copied tokens count as cached and cost no prefill. With recurrent
        state only prefixes another slot saved its state after."""
        if not job.cache_prompt:
            return
        prompt, cache = job.prompt_ids, self.prompt_cache
        length, source = cache.copy_source(job.slot, prompt)
        stored, pages = cache.stored(prompt)
        if max(length, stored) <= job.prefilled:
            return
        if stored > length:
            cache.adopt(job.slot, prompt, stored, pages)
            length = stored
        else:
            state = None if self.engine.rewindable else cache.resumed(source, length)
            self.engine.copy_prefix(source, job.slot, length, state)
            cache.copied(source, job.slot, prompt[:length])
        copied = length - job.prefilled
        job.prefilled = length
        job.cached_tokens += copied
        self.metrics.admitted(0, copied)

    def _step(self) -> None:
        jobs = list(self.active.values())
        decoding = [j for j in jobs if j.generated]
        budget = self.prefill_batch  # prompt tokens per step, over the waiting prompts in turn
        # In admission order, so by a job's turn every earlier one sharing its prefix has computed this
        # step's chunk of it, which the job copies rather than computing it again; then its next chunk
        # is one that no earlier job holds. Nothing waits on another job (a cancelled or failed one
        # leaves the chunk to the next in turn). The step's chunks run together (`_prefill_pending`),
        # those before a job that would copy from one of them first.
        pending: list[tuple[Job, Sequence[int]]] = []
        for job in [j for j in jobs if not j.generated]:
            if any(self._copies_from(job, other, chunk) for other, chunk in pending):
                self._prefill_pending(pending)
                pending = []
            self._for_one(job, self._copy_prefix)
            if self.active.get(job.slot) is not job:
                continue  # the copy failed the job
            chunk = self.prompt_cache.next_chunk(job.prompt_ids, job.prefilled)
            if len(chunk) > budget and budget < self.prefill_batch:
                break  # the step's first chunk always runs
            budget -= len(chunk)
            pending.append((job, chunk))
        self._prefill_pending(pending)
        if self.speculators is not None:
            for job in decoding:
                self._for_one(job, self._speculate)
                self._outbox.flush()  # nor a job's tokens for the next job's verification pass
        elif decoding:
            self._decode(decoding)

    def _decode(self, decoding: list[Job]) -> None:
        """One batched decode step of the `decoding` jobs. When every row is plainly greedy with no
        logprobs (`_queueable`), its tokens stay on the device as the next step's inputs: the step is
        queued first and the previous one's tokens (`_queued`) are read and posted while it runs, so the
        host's work per step overlaps the device's. A job whose queued token ends it (end-of-generation
        or a stop id) has then run one more row, on its own slot past its tokens, whose token is dropped;
        one whose queued token is its last (max_tokens) runs none. Any other row needs its token on the
        host before the next step: the previous step is read first, and this one's rows as before."""
        previous, self._queued = self._queued, None
        queueable = all(self._queueable(j) for j in decoding)
        if previous is not None and not queueable:
            self._post_queued(previous, ())
            previous = None
            decoding = [j for j in decoding if self.active.get(j.slot) is j]
        pending = {} if previous is None else {id(j): i for i, j in enumerate(previous.jobs)}
        rows = [j for j in decoding if not (id(j) in pending and len(j.generated) + 1 >= j.max_tokens)]
        try:
            if rows:
                logits = self.engine.decode_batch(
                    self._inputs(rows, pending, previous),
                    [len(j.prompt_ids) + len(j.generated) - (id(j) not in pending) for j in rows],
                    [j.slot for j in rows],
                )
            if rows and queueable:
                self._queued = Queued(rows, QueuedTokens(first_max_queued(logits)))
            elif rows:
                masked = self._mask_rows(logits, rows)
                plain = [  # a masked row wants no logprobs
                    (m and j.sampler.first_max_of_masked) or self._queueable(j)
                    for j, m in zip(rows, masked, strict=True)
                ]
                tokens, host_rows = greedy_split(logits, plain)
        except Exception as err:  # nothing tells which row failed: the batch's jobs fail
            log.exception("a batched decode step failed")
            for job in decoding:
                self._fail_if_active(job, err)
            return
        for job in rows:
            if id(job) not in pending:
                self.prompt_cache.fed(job.slot, job.generated[-1:])
        if previous is not None:
            self._post_queued(previous, {id(j) for j in rows})
        if rows and not queueable:
            for job, token, row in zip(rows, tokens, host_rows, strict=True):
                if token is None:
                    self._for_one(job, self._sample, row)
                else:  # greedy: the Sampler would pick the same id; its grammar hears it
                    self._for_one(job, self._post_greedy, token)

    @staticmethod
    def _queueable(job: Job) -> bool:
        """Whether a job's next token is its logits' first maximum with nothing read on the host."""
        return job.top_logprobs is None and job.sampler.plain_greedy

    @staticmethod
    def _inputs(
        rows: list[Job], pending: dict[int, int], previous: Queued | None
    ) -> list[int] | torch.Tensor:
        """The step's input ids: each job's last posted token, or its queued one from `previous`'s ids
        on the device (then all of them are there, gathered without the host waiting)."""
        posted = [j.generated[-1] for j in rows]
        if previous is None or not any(id(j) in pending for j in rows):
            return posted
        if [id(j) for j in rows] == [id(j) for j in previous.jobs]:  # the usual step: the same rows
            return previous.tokens.ids
        return previous.tokens.mixed([pending.get(id(j)) for j in rows], posted)

    def _post_queued(self, queued: Queued, fed: Collection[int]) -> None:
        """Read a queued step's tokens and post them to the jobs still running; the jobs in `fed` (ids)
        have had their token fed to a step since, whose KV now holds it."""
        for job, token in zip(queued.jobs, queued.tokens.tolist(), strict=True):
            if self.active.get(job.slot) is not job:
                continue  # cancelled or failed since
            if id(job) in fed:
                self.prompt_cache.fed(job.slot, [token])
            self._for_one(job, self._post_greedy, token)

    def _mask_rows(self, logits: torch.Tensor, decoding: list[Job]) -> list[bool]:
        """Mask in place, in one batch, the rows of the grammar-constrained jobs that want no logprobs
        (theirs are of the raw logits); which rows were masked. Called as soon as the step is queued on
        the device, so the masks are filled on the host while it runs."""
        masked = [
            j.top_logprobs is None and j.constraint is not None and not j.constraint.ended for j in decoding
        ]
        rows = [i for i, m in enumerate(masked) if m]
        if rows:
            if self._masker is None:
                self._masker = BatchMasker()
            self._masker.mask_rows(logits, rows, [decoding[i].constraint for i in rows])
        return masked

    def _post_greedy(self, job: Job, token: int) -> None:
        job.sampler.accept(token)
        self._post(job, token, None)

    def _for_one(self, job: Job, work: Callable[..., None], *args: object) -> None:
        """`work(job, *args)`; an exception fails this job only."""
        try:
            work(job, *args)
        except Exception as err:
            log.exception("generation failed for one request")
            self._fail_if_active(job, err)

    def _fail_if_active(self, job: Job, err: Exception) -> None:
        with self._cond:
            if self.active.get(job.slot) is job:
                self._fail(job, err)

    def _copies_from(self, job: Job, other: Job, chunk: Sequence[int]) -> bool:
        """Whether `job` would copy (`_copy_prefix`) more of its prompt than it holds from `other`'s slot
        once `other`'s pending `chunk` is computed (the cache's reuse rule: a shared chat template's few
        tokens are no reason where only whole chunks are reused)."""
        cache = self.prompt_cache
        return job.cache_prompt and cache.chunk_adds(other.slot, chunk, job.prompt_ids, job.prefilled)

    def _prefill_pending(self, pending: Sequence[tuple[Job, Sequence[int]]]) -> None:
        """Prefill each job's chunk (`PromptCache.next_chunk`), the engine running those it can in one
        pass (`Engine.prefill_parts`); a job's first token at its prompt's end, posted at once. Should
        that pass fail, its chunks run one by one, so a failure fails its own job only."""
        if len(pending) > 1:
            parts = [PrefillPart(job.slot, job.prefilled, chunk) for job, chunk in pending]
            ends = [self._ends_prompt(job, chunk) for job, chunk in pending]
            try:
                rows = self.prompt_cache.prefill_chunks(parts, ends)
            except Exception:
                log.exception("a packed prefill pass failed: its chunks run one by one")
            else:
                for (job, chunk), logits in zip(pending, rows, strict=True):
                    self._for_one(job, self._prefilled, chunk, logits)
                self._outbox.flush()  # the first tokens do not wait for the decode step
                return
        for job, chunk in pending:
            self._for_one(job, self._prefill_chunk, chunk)
            self._outbox.flush()

    def _prefill_chunk(self, job: Job, chunk: Sequence[int]) -> None:
        """Prefill the job's next chunk (`PromptCache.next_chunk`); its first token at the prompt's end."""
        ends = self._ends_prompt(job, chunk)
        self._prefilled(job, chunk, self.prompt_cache.prefill_chunk(job.slot, chunk, job.prefilled, ends))

    @staticmethod
    def _ends_prompt(job: Job, chunk: Sequence[int]) -> bool:
        return job.prefilled + len(chunk) == len(job.prompt_ids)

    def _prefilled(self, job: Job, chunk: Sequence[int], logits: torch.Tensor) -> None:
        """The job's `chunk` was prefilled, `logits` its last token's: sample at the prompt's end."""
        ends = self._ends_prompt(job, chunk)
        job.prefilled += len(chunk)
        if ends:
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
        self.prompt_cache.fed(job.slot, history[-1:])
        posted: list[int] = []
        for index, token in enumerate(tokens):
            history.append(token)
            posted.append(token)
            if self._post(job, token, rows[index]):
                break
        self.prompt_cache.fed(job.slot, posted[:-1])
        self.engine.keep_tokens(job.slot, len(posted))
        job.drafted += stats.drafted
        job.accepted += stats.accepted
        self.metrics.speculated(stats.drafted, stats.accepted)

    def _sample(self, job: Job, logits: torch.Tensor) -> None:
        self._post(job, job.sampler(logits, job.prompt_ids + job.generated), logits)

    def _post(self, job: Job, token: int, logits: torch.Tensor | None) -> bool:
        """Send a token (sampled from `logits`, needed when logprobs are) to the job's handler; True when
        the job ends with it."""
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
        self._outbox.add(job, event)
        if token in self.eog_ids or token in job.stop_ids:
            self._finish(job, FinishEvent("stop"))
        elif len(job.generated) >= job.max_tokens:
            self._finish(job, FinishEvent("length"))
        else:
            return False
        return True

    def _finish(self, job: Job, event: FinishEvent) -> None:
        self._release(job)
        self._outbox.add(job, event)
        self.metrics.finish(event.reason)

    def _release(self, job: Job) -> None:
        self.last_used[job.slot] = time.perf_counter()
        with self._cond:  # `submit` and `gauges` read `active` from other threads
            del self.active[job.slot]

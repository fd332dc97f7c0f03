"""Admission under oversubscription (issue 23, acceptance 4 on the CPU): with more concurrent requests
than sessions plus --max-pending, each one completes with the greedy text or gets a 429, never another
status, and the server answers correctly afterwards. And the whole-chunk reuse rule of an engine whose
prefill is not batch-invariant (gufo.server.scheduler): here the torch prefill layers, which a prefill
tap selects; and a prompt sharing a prefix with one that is cancelled while it prefills."""

from __future__ import annotations

import asyncio
import threading

import openai
import pytest

from gufo.engine.sampling import SamplingParams
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from gufo.server.settings import ServerSettings
from tests.server.conftest import MODEL, live_server, load_engine, wait_for

SESSIONS, MAX_PENDING, CHUNK = 2, 2, 16
REQUESTS = 12  # 3x sessions + queue
PROMPT = "Write one sentence about the sea."


def torch_prefill_engine():
    engine = load_engine(SESSIONS)
    engine.add_prefill_tap(0, lambda hidden: hidden)  # changes nothing but the route
    assert not engine.invariant_prefill
    return engine


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(MODEL, max_tokens=16, max_pending=MAX_PENDING, prefill_chunk=CHUNK)
    with live_server(settings, torch_prefill_engine) as live:
        yield live


def greedy(live, prompt: str | list[int], cache_prompt: bool = False, max_tokens: int = 16):
    reply = live.client().completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"cache_prompt": cache_prompt},
    )
    return reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens


def test_oversubscribed_requests_complete_or_get_429(server):
    reference, _ = greedy(server, PROMPT)
    statuses: list[int] = []
    texts: list[str] = []
    codes: list[str] = []
    start = threading.Barrier(REQUESTS)

    def one() -> None:
        start.wait()
        try:
            texts.append(greedy(server, PROMPT)[0])
            statuses.append(200)
        except openai.APIStatusError as err:
            statuses.append(err.status_code)
            codes.append(err.response.json()["error"]["code"])

    threads = [threading.Thread(target=one) for _ in range(REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(set(statuses)) == [200, 429], statuses
    assert set(codes) == {"queue_full"}
    assert statuses.count(200) >= SESSIONS + MAX_PENDING  # all admitted or queued ones finished
    assert texts == [reference] * len(texts)
    wait_for(lambda: server.metric("gufo_requests_active") == 0 and server.metric("gufo_queue_depth") == 0)
    assert greedy(server, PROMPT)[0] == reference
    assert server.metric_labelled("error") == 0


def test_without_batch_invariant_prefill_only_whole_chunks_of_prompt_are_reused(server):
    prompt = list(range(1000, 1040))  # 40 tokens: chunks 0-15, 16-31, 32-39
    other = prompt[:21] + list(range(2000, 2010))
    greedy(server, other, cache_prompt=True, max_tokens=1)
    after_prefix, cached = greedy(server, prompt, cache_prompt=True)
    assert cached == 16  # of the 21 shared tokens, the whole chunk
    alone, cached = greedy(server, prompt)
    assert cached == 0
    again, cached = greedy(server, prompt, cache_prompt=True)
    assert cached == 32  # of 39 (the last prompt token is always evaluated), two whole chunks
    assert after_prefix == alone == again


def scheduled_tokens(engine, jobs: list[Job], awaited: list[Job], on_prefill=None) -> list[list[int]]:
    """The tokens of the `awaited` jobs (a cancelled one hears nothing more), `jobs` all submitted at
    once to a Scheduler of their own on `engine` (chunks of CHUNK, nothing cached in its slots at the
    start); `on_prefill(scheduler, slot, start)` hears each prefill call once it has run."""
    scheduler = Scheduler(engine, Metrics(), max_pending=len(jobs), prefill_chunk=CHUNK)
    prefill = engine.prefill

    def heard(tokens, slot=0, start=0, all_logits=False):
        logits = prefill(tokens, slot, start, all_logits)
        if on_prefill is not None:
            on_prefill(scheduler, slot, start)
        return logits

    async def go() -> list[list[int]]:
        for job in jobs:
            job.loop = asyncio.get_running_loop()
            scheduler.submit(job)
        scheduler.start()
        out = []
        for job in awaited:
            tokens = []
            while not isinstance(event := await job.events.get(), FinishEvent):
                tokens.append(event.token)
            assert event.reason == "length"
            out.append(tokens)
        return out

    engine.prefill = heard
    try:
        return asyncio.run(go())
    finally:
        scheduler.stop()
        del engine.prefill


def test_a_prompt_whose_leader_is_cancelled_computes_the_rest_of_the_shared_prefix_itself():
    """Two prompts sharing 40 tokens, admitted together: the follower copies each chunk the leader
    prefills, and once the leader is cancelled (after its second chunk) computes the rest itself, with
    the tokens it gets alone with nothing cached."""
    engine = torch_prefill_engine()
    prompt = list(range(1000, 1060))  # chunks 0-15, 16-31, 32-47, 48-59
    greedy = SamplingParams(temperature=0.0)
    fresh = Job(prompt, 16, greedy, None, cache_prompt=False)
    (alone,) = scheduled_tokens(engine, [fresh], [fresh])
    leader = Job(prompt[:40] + list(range(2000, 2020)), 16, greedy, None)
    follower = Job(prompt, 16, greedy, None)
    calls: list[tuple[int, int]] = []

    def cancel_after_the_second_chunk(scheduler: Scheduler, slot: int, start: int) -> None:
        calls.append((slot, start))
        if slot == leader.slot and start == CHUNK:
            scheduler.cancel(leader)

    (tokens,) = scheduled_tokens(engine, [leader, follower], [follower], cancel_after_the_second_chunk)
    assert leader.cancelled == "cancelled"
    assert [start for slot, start in calls if slot == follower.slot] == [2 * CHUNK, 3 * CHUNK]
    assert follower.cached_tokens == 2 * CHUNK  # the two chunks the leader prefilled
    assert tokens == alone

"""Admission under oversubscription (issue 23, acceptance 4 on the CPU): with more concurrent requests
than sessions plus --max-pending, each one completes with the greedy text or gets a 429, never another
status, and the server answers correctly afterwards. And the whole-chunk reuse rule of an engine whose
prefill is not batch-invariant (gufo.server.scheduler): here the torch prefill layers, which a prefill
tap selects."""

from __future__ import annotations

import threading

import openai
import pytest

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

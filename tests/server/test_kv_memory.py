"""A KV cache smaller than sessions x context (`gufo serve --kv-memory`): requests are admitted while
the pool has the pages their prompt and max_tokens need, wait otherwise, and each one's greedy text is
what it gets alone on a server with the whole cache."""

from __future__ import annotations

import threading

import pytest

from gufo.engine.engine import Engine
from gufo.errors import BadInputError
from gufo.options import RunOptions
from gufo.server.settings import ServerSettings
from tests.server.conftest import MODEL, live_server, wait_for

SESSIONS, CONTEXT, PAGES = 4, 256, 7
PROMPT_TOKENS, MAX_TOKENS = 50, 24  # 74 positions: 2 pages, and one for a copy on write, per request
PROMPTS = [[(17 * i + 5 * j) % 900 + 100 for j in range(PROMPT_TOKENS)] for i in range(8)]


def engine(kv_memory: int | None) -> Engine:
    return Engine(MODEL, RunOptions(threads=1), context=CONTEXT, n_slots=SESSIONS, kv_memory=kv_memory)


def page_bytes() -> int:
    """smollm2-135m's float32 KV page: 30 layers x 3 KV heads x 64 positions x (64 + 64) values."""
    return 30 * 3 * 64 * 128 * 4


def complete(live, prompt: list[int]) -> str:
    reply = live.client().completions.create(
        model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body={"cache_prompt": False}
    )
    return reply.choices[0].text


@pytest.fixture(scope="module")
def alone() -> list[str]:
    """Each prompt on its own, with every session's whole context in the cache."""
    settings = ServerSettings(MODEL, max_tokens=MAX_TOKENS, max_pending=8)
    with live_server(settings, lambda: engine(None)) as live:
        return [complete(live, prompt) for prompt in PROMPTS]


def test_requests_wait_for_pages_and_keep_their_text(alone):
    settings = ServerSettings(MODEL, max_tokens=MAX_TOKENS, max_pending=8)
    with live_server(settings, lambda: engine(PAGES * page_bytes())) as live:
        assert live.metric("gufo_kv_pages") == PAGES and live.metric("gufo_sessions") == SESSIONS
        busiest, done = [0], threading.Event()

        def watch() -> None:  # the most requests that held a slot at once
            while not done.is_set():
                busiest[0] = max(busiest[0], live.metric("gufo_requests_active"))

        texts: dict[int, str] = {}
        start = threading.Barrier(len(PROMPTS))

        def one(i: int) -> None:
            start.wait()
            texts[i] = complete(live, PROMPTS[i])

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        watcher.join()
        assert [texts[i] for i in range(len(PROMPTS))] == alone
        # 3 pages each of 7: two at a time, though four sessions are free
        assert 1 <= busiest[0] <= 2
        wait_for(lambda: live.metric("gufo_requests_active") == 0 and live.metric("gufo_queue_depth") == 0)
        assert live.metric("gufo_kv_pages_free") <= PAGES  # finished requests keep their prefixes cached
        assert complete(live, PROMPTS[0]) == alone[0]
        assert live.metric_labelled("error") == 0


def test_too_little_kv_memory_for_one_context_is_refused():
    with pytest.raises(BadInputError, match="holds less than one sequence of 256 tokens"):
        engine(3 * page_bytes())


def test_a_prefix_outlives_its_session():
    """One session: a 100-token prompt, then one that shares nothing (the session starts over), then the
    first one extended: its first page (64 positions) comes back from the prefix store, and the text is
    the one a whole prefill gives."""
    first = [(13 * j) % 700 + 200 for j in range(100)]
    settings = ServerSettings(MODEL, max_tokens=MAX_TOKENS, max_pending=4)
    with live_server(settings, lambda: Engine(MODEL, RunOptions(threads=1), context=CONTEXT)) as live:

        def reply(prompt: list[int], cache_prompt: bool):
            return live.client().completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=4,
                temperature=0,
                extra_body={"cache_prompt": cache_prompt},
            )

        reply(first, True)
        assert live.metric("gufo_kv_pages_stored") == 0
        reply(PROMPTS[0], True)
        assert live.metric("gufo_kv_pages_stored") == 1  # the session started over: `first`'s whole page
        extended = first + [301, 302]
        cached = reply(extended, True)
        assert cached.usage.prompt_tokens_details.cached_tokens == 64
        assert cached.choices[0].text == reply(extended, False).choices[0].text

"""Continuous batching, the bounded queue and cancellation, on a server with 2 sessions."""

from __future__ import annotations

import openai
import pytest

from gufo.server.settings import ServerSettings
from tests.server.conftest import MODEL, assert_error, live_server, load_engine, wait_for

PROMPTS = ["Tell me about cats.", "What is rain?", "Count to five.", "Describe a tree."]
ARGS = {"model": MODEL, "temperature": 0, "max_tokens": 10, "extra_body": {"cache_prompt": False}}


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(MODEL, max_tokens=200, max_pending=2)
    with live_server(settings, lambda: load_engine(2)) as live:
        yield live


def messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def text_of(stream) -> str:
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_four_streams_equal_sequential_and_fifth_gets_429(server):
    client = server.client()
    sequential = [
        client.chat.completions.create(messages=messages(p), **ARGS).choices[0].message.content
        for p in PROMPTS
    ]
    # Each create returns once the server has queued the request (the role chunk comes first), so after
    # four of them both sessions are busy and the queue (2) is full.
    streams = [client.chat.completions.create(messages=messages(p), stream=True, **ARGS) for p in PROMPTS]
    assert server.metric("gufo_requests_active") + server.metric("gufo_queue_depth") == 4
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(messages=messages("one too many"), **ARGS)
    status, body = raised.value.status_code, raised.value.response.json()
    error = assert_error(status, body, 429, "queue_full")
    assert error["type"] == "rate_limit_error"
    assert raised.value.response.headers["retry-after"] == "1"
    assert [text_of(s) for s in streams] == sequential
    assert all(sequential)


def test_closing_a_stream_frees_its_slot(server):
    client = server.client()
    long_args = {**ARGS, "max_tokens": 200}
    first = client.chat.completions.create(messages=messages("Write a long story."), stream=True, **long_args)
    other = client.chat.completions.create(messages=messages("Write a long poem."), stream=True, **long_args)
    for _, _ in zip(range(3), first, strict=False):  # a few chunks in, then the client goes away
        pass
    first.close()
    # Both sessions were busy: this request runs only because the closed stream's slot was freed, and
    # it finishes while the other long stream is still going.
    reply = client.chat.completions.create(messages=messages("Say hi."), **ARGS)
    assert reply.choices[0].message.content
    assert server.metric("gufo_requests_active") == 1
    assert server.metric('gufo_requests_finished_total{reason="cancelled"}') >= 1
    other.close()
    wait_for(lambda: server.metric("gufo_requests_active") == 0 and server.metric("gufo_queue_depth") == 0)

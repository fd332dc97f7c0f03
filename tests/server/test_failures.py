"""Failures stay where they happen (issue 27): a fuzz of random bodies over every route's parameters
gets no 500 and leaves the greedy answer as it was; an exception inside one request fails only that
request, with the other stream and the cached prefixes intact; a stopped worker turns /health 503;
clients that send their headers or body too slowly are cut off."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gufo.engine.engine import Engine
from gufo.server.settings import ServerSettings
from tests.conftest import HANG_GUARD_S
from tests.server.conftest import MODEL, assert_error, live_server, load_engine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
POISON = 1234  # a prompt token that makes the test engine's prefill raise


class WorkerKilled(BaseException):
    """Not an Exception: nothing meant for one request catches it, so the worker loop itself stops."""


def engine_with_faults(n_slots: int) -> Engine:
    """A real engine whose prefill raises for a prompt holding POISON (a fault inside one request), and
    stops the worker for a prompt starting with POISON twice."""
    engine = load_engine(n_slots)
    prefill = engine.prefill

    def faulty_prefill(ids, slot, start=0):
        if list(ids[:2]) == [POISON, POISON]:
            raise WorkerKilled("test: the worker is killed")
        if POISON in ids:
            raise RuntimeError("test: a fault in one request")
        return prefill(ids, slot, start=start)

    engine.prefill = faulty_prefill
    return engine


@pytest.fixture(scope="module")
def server():
    settings_ = ServerSettings(MODEL, max_tokens=4, max_pending=2, body_timeout=1.0, header_timeout=1.0)
    with live_server(settings_, lambda: engine_with_faults(3)) as live:
        yield live


def greedy(server, prompt: str | list[int] = "The capital of France is", cache_prompt: bool = True) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "cache_prompt": cache_prompt}
    status, reply = server.request("POST", COMPLETIONS, body)
    assert status == 200, reply
    return reply


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
numbers = (
    st.integers() | st.floats() | st.sampled_from([2**64, 2**64 - 1, -(2**63) - 1, 1e-38, 5e-324, 1e308])
)
# Values in each field's range, boundaries included (the sampler must stay finite at all of them).
tiny = st.sampled_from([0.0, 5e-324, 1e-300, 1e-38, 1e-6])
PLAUSIBLE = {
    "max_tokens": st.integers(1, 4),
    "temperature": tiny | st.floats(0, 2),
    "top_p": st.floats(5e-324, 1),
    "top_k": st.integers(0, 2**70),
    "min_p": st.floats(0, 1),
    "repeat_penalty": st.floats(0.01, 100),
    "presence_penalty": st.floats(-2, 2),
    "frequency_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(st.integers(0, 49151).map(str), st.floats(-100, 100), max_size=3),
    "seed": st.integers(-(2**63), 2**64 - 1),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=4),
    "stop_token_ids": st.lists(st.integers(), max_size=3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "cache_prompt": st.booleans(),
}
CHAT_PLAUSIBLE = {
    **PLAUSIBLE,
    "max_completion_tokens": st.integers(1, 4),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20),
    "response_format": st.just({"type": "text"}),
    "tool_choice": st.just("none"),
}
COMPLETION_PLAUSIBLE = {**PLAUSIBLE, "logprobs": st.integers(0, 5), "echo": st.booleans()}
# Anything at all, in every field and in fields the server does not know.
WILD_EXTRA = {"n": json_values, "user": json_values, "unknown": json_values, "tools": json_values}
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"])},
    optional={"content": st.text(max_size=20)},
)
wild_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "x"]) | json_values},
    optional={
        "content": st.text(max_size=20) | json_values,
        "tool_calls": json_values,
        "tool_call_id": json_values,
        "name": json_values,
    },
)


def bodies(required: dict, wild_required: dict, plausible: dict) -> st.SearchStrategy:
    """Bodies with every field in range, bodies where any field may hold anything, and any JSON."""
    wild = {name: value | numbers | json_values for name, value in plausible.items()} | WILD_EXTRA
    return (
        st.fixed_dictionaries(required, optional=plausible)
        | st.fixed_dictionaries(wild_required, optional=wild)
        | json_values
    )


chat_bodies = bodies(
    {"model": st.just(MODEL), "messages": st.lists(message, min_size=1, max_size=3)},
    {"model": st.just(MODEL) | json_values, "messages": st.lists(wild_message, max_size=3) | json_values},
    CHAT_PLAUSIBLE,
)
completion_bodies = bodies(
    {
        "model": st.just(MODEL),
        "prompt": st.text(min_size=1, max_size=30)
        | st.lists(st.integers(0, 49151), max_size=40)
        | st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=2),
    },
    {"model": st.just(MODEL) | json_values, "prompt": st.lists(numbers, max_size=4) | json_values},
    COMPLETION_PLAUSIBLE,
)
EMBEDDINGS, TOKENIZE, DETOKENIZE = "/v1/embeddings", "/tokenize", "/detokenize"
embedding_bodies = bodies(
    {
        "input": st.text(min_size=1, max_size=20)
        | st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3)
        | st.lists(st.integers(0, 49151), min_size=1, max_size=10)
    },
    {"input": json_values | st.lists(st.lists(numbers, max_size=3), max_size=3)},
    {
        "model": st.just(MODEL),
        "encoding_format": st.sampled_from(["float", "base64"]),
        "dimensions": st.integers(1, 1000),
    },
)
tokenize_bodies = bodies(
    {"content": st.text(max_size=30)},
    {"content": json_values},
    {"add_special": st.booleans(), "parse_special": st.booleans(), "with_pieces": st.booleans()},
)
detokenize_bodies = bodies(
    {"tokens": st.lists(st.integers(0, 49151), max_size=10)}, {"tokens": st.lists(numbers, max_size=4)}, {}
)
ROUTES = [
    ("POST", CHAT),
    ("POST", COMPLETIONS),
    ("POST", EMBEDDINGS),
    ("POST", TOKENIZE),
    ("POST", DETOKENIZE),
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("GET", f"/v1/models/{MODEL}"),
]
STRATEGIES = {
    CHAT: chat_bodies,
    COMPLETIONS: completion_bodies,
    EMBEDDINGS: embedding_bodies,
    TOKENIZE: tokenize_bodies,
    DETOKENIZE: detokenize_bodies,
}


def encode(value) -> bytes:
    return json.dumps(value).encode()  # NaN and Infinity go out as such: the server must refuse them


@pytest.fixture(scope="module")
def greedy_before(server) -> str:
    return greedy(server)["choices"][0]["text"]


@pytest.mark.parametrize("method,path", ROUTES)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_every_route_gets_no_500(server, greedy_before, method, path, data):
    strategy = STRATEGIES.get(path, json_values)
    status, answer = server.request(method, path, encode(data.draw(strategy)))
    event(f"{path} {status}")  # --hypothesis-show-statistics shows how many reached generation
    if status == 200:
        assert "server_error" not in json.dumps(answer), answer  # no error event inside a stream either
    else:
        error = assert_error(status, answer, status)
        assert status in (400, 404), error


def test_after_the_fuzz_the_worker_runs_and_greedy_is_unchanged(server, greedy_before):
    assert server.request("GET", "/health")[0] == 200
    assert server.metric("gufo_worker_up") == 1
    assert greedy(server)["choices"][0]["text"] == greedy_before


def test_a_fault_in_one_request_fails_only_that_request(server):
    # Longer than anything the fuzz left in a slot (its prompts stay under 100 tokens), so requests
    # without prefix reuse, which take the free slot holding the least, leave this one alone.
    prompt = "A long shared opening about rivers, stones, light and gardens in the morning. " * 8
    greedy(server, prompt)  # its KV now fills one slot
    reused = greedy(server, prompt)
    assert reused["usage"]["prompt_tokens_details"]["cached_tokens"] == reused["usage"]["prompt_tokens"] - 1
    cats_alone = greedy(server, "Tell me about cats.", cache_prompt=False)
    cats: list[dict] = []
    thread = threading.Thread(target=lambda: cats.append(greedy(server, "Tell me about cats.", False)))
    thread.start()
    body = {"model": MODEL, "prompt": [1, POISON, 2], "max_tokens": 2, "cache_prompt": False}
    error = assert_error(*server.request("POST", COMPLETIONS, body), 500)
    assert error["type"] == "server_error" and "a fault in one request" in error["message"]
    thread.join(HANG_GUARD_S)
    assert cats and cats[0]["choices"][0]["text"] == cats_alone["choices"][0]["text"]
    again = greedy(server, prompt)  # the cached prefix survived: same reuse, same text
    assert again["usage"]["prompt_tokens_details"] == reused["usage"]["prompt_tokens_details"]
    assert again["choices"][0]["text"] == reused["choices"][0]["text"]
    assert server.request("GET", "/health")[0] == 200


def raw_connection(server) -> socket.socket:
    port = int(server.base_url.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=HANG_GUARD_S)


def test_slow_headers_are_cut_off(server):
    with raw_connection(server) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        assert conn.recv(1024) == b""  # closed by the server after --header-timeout


def test_slow_body_gets_408(server):
    with raw_connection(server) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        response = b""
        while chunk := conn.recv(4096):
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert_error(408, json.loads(body), 408, "request_timeout")


def test_a_stopped_worker_turns_health_503(server):
    # Last in this module: the worker does not come back.
    status, body = server.request(
        "POST", COMPLETIONS, {"model": MODEL, "prompt": [POISON, POISON, 2], "max_tokens": 2}
    )
    error = assert_error(status, body, 500)
    assert "worker" in error["message"]
    error = assert_error(*server.request("GET", "/health"), 503, "worker_stopped")
    assert "test: the worker is killed" in error["message"]
    assert server.metric("gufo_worker_up") == 0
    assert_error(
        *server.request("POST", COMPLETIONS, {"model": MODEL, "prompt": "Hi"}), 503, "worker_stopped"
    )

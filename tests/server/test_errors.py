"""Every error status with OpenAI's error body, 503 while loading, and random bodies that must not
bring the server down."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gufo.server.settings import ServerSettings
from tests.conftest import HANG_GUARD_S
from tests.server.conftest import MODEL, assert_error, live_server, load_engine

KEY = "test-key"
LIMIT = 4096
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROUTES = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", CHAT),
    ("POST", COMPLETIONS),
    ("POST", "/v1/embeddings"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("GET", f"/v1/models/{MODEL}"),
]


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(MODEL, max_tokens=2, api_key=KEY, max_request_bytes=LIMIT)
    with live_server(settings, lambda: load_engine(1)) as live:
        yield live


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize("method,path", [*ROUTES, ("GET", "/no/such/route")])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic dGVzdC1rZXk=", KEY])
def test_401_without_the_right_key_on_every_route(server, method, path, auth):
    headers = {"Authorization": auth or ""}  # replaces the right key that `request` would send
    status, body = server.request(method, path, b"{}" if method == "POST" else None, headers)
    assert_error(status, body, 401, "invalid_api_key")


@pytest.mark.parametrize(
    "body,param,fragment",
    [
        (b'{"model": "x", "messages": [', None, "malformed JSON"),
        (b"not json at all", None, "malformed JSON"),
        (json.dumps(chat(temperature=5)).encode(), "temperature", "temperature"),
        (json.dumps(chat(n=2)).encode(), "n", "only n=1"),
        (json.dumps(chat(messages=[])).encode(), "messages", "messages"),
        (json.dumps(chat(messages=[{"role": "wizard", "content": "x"}])).encode(), "messages.0.role", "role"),
        (json.dumps(chat(max_tokens=0)).encode(), "max_tokens", "max_tokens"),
        (json.dumps(chat(model=5)).encode(), "model", "model"),
        (b"[1, 2, 3]", None, "request body"),
    ],
)
def test_400_names_the_field(server, body, param, fragment):
    error = assert_error(*server.request("POST", CHAT, body), 400)
    assert error["param"] == param and fragment in error["message"]
    assert error["type"] == "invalid_request_error"


def test_400_prompt_longer_than_context(server):
    status, body = server.request("POST", COMPLETIONS, {"model": MODEL, "prompt": "word " * 600})
    error = assert_error(status, body, 400, "context_length_exceeded")
    assert error["param"] == "prompt"


def test_404_unknown_model_and_route(server):
    error = assert_error(*server.request("POST", CHAT, chat(model="gpt-4")), 404, "model_not_found")
    assert error["param"] == "model" and "gpt-4" in error["message"]
    error = assert_error(*server.request("GET", "/v1/engines"), 404, "not_found")
    assert "/v1/engines" in error["message"]


def test_a_request_without_model_gets_the_served_one(server):
    """llama-server's clients often leave `model` out: it is optional, the server has one model."""
    status, body = server.request("POST", CHAT, {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body
    assert body["model"] == MODEL and body["choices"][0]["message"]["role"] == "assistant"


def test_413_body_over_the_limit(server):
    oversized = chat(messages=[{"role": "user", "content": "x" * LIMIT}])
    error = assert_error(*server.request("POST", CHAT, oversized), 413, "request_too_large")
    assert str(LIMIT) in error["message"]


def test_503_while_loading_then_after_a_failed_load():
    release = threading.Event()

    def slow_failing_load():
        release.wait(HANG_GUARD_S)
        raise RuntimeError("test: no model")

    with live_server(ServerSettings(MODEL), slow_failing_load, wait_ready=False) as live:
        assert_error(*live.request("GET", "/health"), 503, "model_loading")
        assert_error(*live.request("POST", CHAT, chat()), 503, "model_loading")
        assert live.request("GET", "/metrics")[0] == 200
        release.set()
        for _ in range(100):
            status, body = live.request("GET", "/health")
            if "failed" in body["error"]["message"]:
                break
            time.sleep(0.05)
        error = assert_error(status, body, 503)
        assert "test: no model" in error["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
fields = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "other"]) | st.text(max_size=8),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]), "content": json_values}),
            max_size=3,
        )
        | json_values,
        "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 60000), max_size=5) | json_values,
        "max_tokens": st.integers(-2, 3) | json_values,
        "temperature": st.floats(allow_nan=True) | json_values,
        "stream": st.booleans(),
        "stop": json_values,
        "logprobs": json_values,
        "top_logprobs": st.integers(-1, 30),
    },
)
bodies = (
    st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | fields.map(lambda v: json.dumps(v).encode())
    | st.integers(LIMIT + 1, 4 * LIMIT).map(lambda n: b"{" + b" " * n + b"}")
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from([CHAT, COMPLETIONS]), body=bodies)
def test_random_bodies_get_an_answer_and_the_server_stays_up(server, path, body):
    status, answer = server.request("POST", path, body)
    if status == 200:
        assert isinstance(answer, dict | str)  # a completion, or an SSE stream for stream=true
    else:
        assert_error(status, answer, status)
        assert status in (400, 404, 413)
    assert server.request("GET", "/health")[0] == 200

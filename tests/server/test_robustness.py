"""One bad request never hurts another (issue 27): out-of-range and coerced fields get a 400 naming them
while other streams run on unchanged; values the server implements (logit_bias, presence/frequency
penalties, echo, tool history, tiny temperatures) are checked against independent oracles; a failure
inside one request fails only that request; a stopped worker turns /health 503; slow clients time out."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter

import pytest
import torch

from gufo.engine.sampling import Sampler, SamplingParams
from gufo.server.schemas import ChatCompletionRequest
from gufo.server.settings import ServerSettings
from gufo.tokenizer import chat
from tests.conftest import HANG_GUARD_S
from tests.server.conftest import MODEL, assert_error, live_server, load_engine, wait_for

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
LIMIT = 48  # the server's --max-tokens
STREAM_PROMPTS = ["Write a long story about a dragon.", "Explain how rivers form, in detail."]


@pytest.fixture(scope="module")
def server():
    # Three sessions: two long streams run while requests that pass validation still get a slot.
    settings = ServerSettings(MODEL, max_tokens=LIMIT, max_pending=4)
    with live_server(settings, lambda: load_engine(3)) as live:
        yield live


def chat_body(content: str = "Name three colors.", **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def greedy_chat(server, content: str, max_tokens: int) -> str:
    status, body = server.request(
        "POST", CHAT, chat_body(content, temperature=0, max_tokens=max_tokens, cache_prompt=False)
    )
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


BAD_CHAT = [
    ({"seed": 2**64}, "seed"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"seed": 10**40}, "seed"),
    ({"temperature": 1, "repeat_penalty": 1e-38}, "repeat_penalty"),
    ({"temperature": 1, "repeat_penalty": 0}, "repeat_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -1e-38}, "temperature"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": "4"}, "max_tokens"),
    ({"max_tokens": 4.0}, "max_tokens"),
    ({"max_tokens": LIMIT + 1}, "max_tokens"),
    ({"max_completion_tokens": LIMIT + 1}, "max_completion_tokens"),
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"temperature": "1"}, "temperature"),
    ({"logprobs": 1}, "logprobs"),
    ({"logit_bias": {"-1": 5}}, "logit_bias"),
    ({"logit_bias": {"999999": 5}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"five": 1}}, "logit_bias"),
    ({"n": 2}, "n"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"not": {}}}}},
        "response_format",
    ),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}]}, "tools"),
    (
        {
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        "tool_choice",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"no_such_parameter": 1}, "no_such_parameter"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages"),
    ({"stop": 5}, "stop"),
]
BAD_COMPLETIONS = [
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"echo": "yes"}, "echo"),
    ({"suffix": "the end"}, "suffix"),
    ({"best_of": 2}, "best_of"),
    ({"n": 3}, "n"),
    ({"max_tokens": LIMIT + 1}, "max_tokens"),
    ({"prompt": [1, 2, 49152]}, "prompt"),
]


def stream_text(server, prompt: str, max_tokens: int, started: threading.Event, out: list) -> None:
    """A raw SSE stream's text and last finish reason; `started` is set at the first content chunk."""
    body = chat_body(prompt, temperature=0, max_tokens=max_tokens, stream=True, cache_prompt=False)
    conn = socket.create_connection(
        ("127.0.0.1", int(server.base_url.rsplit(":", 1)[1])), timeout=HANG_GUARD_S
    )
    payload = json.dumps(body).encode()
    conn.sendall(
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
        + payload
    )
    texts, finish, events = [], None, []
    with conn.makefile("rb") as lines:
        for raw in lines:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            events.append(data)
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    texts.append(choice["delta"]["content"])
                    started.set()
                finish = choice.get("finish_reason") or finish
    started.set()
    out.append(("".join(texts), finish, events))
    conn.close()


def test_bad_requests_get_400_while_two_streams_run_unchanged(server, reference_engine):
    alone = [greedy_chat(server, p, LIMIT) for p in STREAM_PROMPTS]
    results: list[list] = [[], []]
    started = [threading.Event(), threading.Event()]
    threads = [
        threading.Thread(target=stream_text, args=(server, p, LIMIT, started[i], results[i]))
        for i, p in enumerate(STREAM_PROMPTS)
    ]
    for thread in threads:
        thread.start()
    for event in started:
        assert event.wait(HANG_GUARD_S)
    for fields, param in BAD_CHAT:
        error = assert_error(*server.request("POST", CHAT, chat_body(**{"max_tokens": 2, **fields})), 400)
        assert error["param"].split(".")[0] == param and error["type"] == "invalid_request_error", fields
        assert "str" not in error["param"].split("."), error  # the field, not pydantic's union member
    for fields, param in BAD_COMPLETIONS:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2, **fields}
        error = assert_error(*server.request("POST", COMPLETIONS, body), 400)
        assert error["param"].split(".")[0] == param, fields
    # In range, at both ends of the seed range and near zero temperature: served while the streams run.
    for seed in (2**64 - 1, -(2**63)):
        status, body = server.request("POST", CHAT, chat_body(temperature=1, seed=seed, max_tokens=2))
        assert status == 200, body
    greedy = greedy_chat(server, "Name three colors.", 8)
    for temperature in (1e-38, 1e-300, 5e-324):  # the limit T -> 0 is the argmax: greedy text
        fields = {"temperature": temperature, "max_tokens": 8, "cache_prompt": False}
        status, body = server.request("POST", CHAT, chat_body(**fields))
        assert status == 200 and body["choices"][0]["message"]["content"] == greedy, body
    for thread in threads:
        thread.join(HANG_GUARD_S)
    assert [r[0][0] for r in results] == alone
    assert all(r[0][2][-1] == "[DONE]" and r[0][1] in ("stop", "length") for r in results)
    # Served correctly afterwards: the same greedy text as gufo's Engine.
    assert greedy_chat(server, "Say hi.", 8) == engine_greedy(reference_engine, chat_prompt("Say hi."), 8)[1]
    assert server.metric("gufo_worker_up") == 1


def chat_prompt(content: str) -> str:
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{content}<|im_end|>\n" + ASSISTANT


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the template's default
ASSISTANT = "<|im_start|>assistant\n"


def engine_greedy(engine, prompt: str, max_tokens: int) -> tuple[list[int], str]:
    tok = engine.tokenizer
    prompt_ids = tok.encode(prompt, add_special=True, parse_special=True)
    ids = engine.generate(prompt_ids, max_tokens, SamplingParams(temperature=0)).generated_ids
    return ids, tok.decode([t for t in ids if t not in tok.eog_ids])


def penalized_greedy(engine, prompt: str, steps: int, presence: float, frequency: float) -> list[int]:
    """OpenAI's formula written out: logit[j] -= count[j] * frequency + (count[j] > 0) * presence,
    counting generated tokens only, then argmax."""
    tok = engine.tokenizer
    prompt_ids = tok.encode(prompt, add_special=True, parse_special=True)
    logits = engine.prefill(prompt_ids, 0)
    out: list[int] = []
    for _ in range(steps):
        adjusted = logits.double().clone()
        for token, count in Counter(out).items():
            adjusted[token] -= count * frequency + presence
        out.append(int(torch.argmax(adjusted)))
        if out[-1] in tok.eog_ids:
            break
        logits = engine.decode(out[-1], len(prompt_ids) + len(out) - 1, 0)
    return out


def completion(server, prompt, **fields) -> dict:
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "cache_prompt": False, **fields}
    status, reply = server.request("POST", COMPLETIONS, body)
    assert status == 200, reply
    return reply


def test_presence_and_frequency_penalties_follow_openai(server, reference_engine):
    prompt = "one two one two one two one two"
    expected = penalized_greedy(reference_engine, prompt, 12, presence=1.5, frequency=1.0)
    plain, _ = engine_greedy(reference_engine, prompt, 12)
    assert expected != plain  # the penalties change this output, so the test can tell
    reply = completion(server, prompt, max_tokens=12, presence_penalty=1.5, frequency_penalty=1.0, logprobs=0)
    tok = reference_engine.tokenizer
    assert reply["choices"][0]["logprobs"]["tokens"] == [tok.token_text(t) for t in expected]


def test_logit_bias_forces_and_bans_tokens(server, reference_engine):
    tok = reference_engine.tokenizer
    forced = tok.encode(" river", add_special=False)[0]
    reply = completion(server, "Hello", max_tokens=4, logit_bias={str(forced): 100}, logprobs=0)
    assert reply["choices"][0]["logprobs"]["tokens"] == [tok.token_text(forced)] * 4
    plain, _ = engine_greedy(reference_engine, "Hello", 1)
    reply = completion(server, "Hello", max_tokens=1, logit_bias={str(plain[0]): -100}, logprobs=0)
    assert reply["choices"][0]["logprobs"]["tokens"] != [tok.token_text(plain[0])]


def test_echo_puts_the_prompt_first(server, reference_engine):
    prompt = "The three primary colors are"
    _, text = engine_greedy(reference_engine, prompt, 6)
    assert completion(server, prompt, max_tokens=6, echo=True)["choices"][0]["text"] == prompt + text
    status, raw = server.request(
        "POST",
        COMPLETIONS,
        {
            "model": MODEL,
            "prompt": prompt,
            "max_tokens": 6,
            "temperature": 0,
            "echo": True,
            "stream": True,
            "cache_prompt": False,
        },
    )
    chunks = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data: {")]
    assert status == 200 and "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == prompt + text


TOOL_HISTORY = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
]
# The same history as HF chat templates take it, written by hand: developer is system, arguments a dict.
HF_TOOL_HISTORY = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": "18 C, sunny", "tool_call_id": "call_1"},
]


def test_tool_history_and_developer_reach_the_template(server, reference_engine):
    # A template that shows every part of a tool exchange, as tool-calling models' templates do.
    template = (
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
        "{% for c in m.tool_calls or [] %}<call {{ c.id }} {{ c.function.name }} "
        "{{ c.function.arguments | tojson }}>{% endfor %}"
        "{% if m.tool_call_id %}<for {{ m.tool_call_id }}>{% endif %}{% endfor %}"
    )
    parsed = ChatCompletionRequest.model_validate({"model": MODEL, "messages": TOOL_HISTORY})
    rendered = chat.render(template, [m.as_template_input() for m in parsed.messages], False)
    assert rendered == (
        "[system]Answer briefly.[user]What is the weather in Paris?"
        '[assistant]<call call_1 get_weather {"city": "Paris"}>[tool]18 C, sunny<for call_1>'
    )
    # Through the server with the model's own template: the text of the same history rendered by hand.
    prompt = reference_engine.tokenizer.apply_chat_template(HF_TOOL_HISTORY)
    _, text = engine_greedy(reference_engine, prompt, 8)
    body = {
        "model": MODEL,
        "messages": TOOL_HISTORY,
        "temperature": 0,
        "max_tokens": 8,
        "cache_prompt": False,
    }
    status, reply = server.request("POST", CHAT, body)
    assert status == 200 and reply["choices"][0]["message"]["content"] == text


def test_no_op_values_are_accepted(server):
    fields = {"response_format": {"type": "text"}, "tool_choice": "none", "tools": [], "n": 1, "user": "u"}
    status, body = server.request("POST", CHAT, chat_body(max_tokens=2, **fields))
    assert status == 200, body
    status, body = server.request(
        "POST", COMPLETIONS, {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "best_of": 1, "suffix": ""}
    )
    assert status == 200, body


def test_stop_string_endings_count_as_stop(server, reference_engine):
    prompt = "The three primary colors are"
    _, text = engine_greedy(reference_engine, prompt, 12)
    stop = text.split()[1]
    stops, cancelled = server.metric_labelled("stop"), server.metric_labelled("cancelled")
    reply = completion(server, prompt, max_tokens=12, stop=[stop])
    assert (
        reply["choices"][0]["finish_reason"] == "stop"
        and reply["choices"][0]["text"] == text[: text.index(stop)]
    )
    wait_for(lambda: server.metric_labelled("stop") == stops + 1)
    assert server.metric_labelled("cancelled") == cancelled


def test_extreme_rows_stay_finite_and_leave_other_rows_alone():
    logits = torch.linspace(-20, 30, 100)
    history = [99, 98, 97]
    for params in (
        SamplingParams(temperature=1e-38, seed=1),
        SamplingParams(temperature=5e-324, seed=1),
        SamplingParams(temperature=1.0, repeat_penalty=1e-38, seed=1),  # a logit overflows to inf
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1),
    ):
        sampler = Sampler(params)
        p = sampler.probabilities(logits, history)
        assert torch.isfinite(p).all() and float(p.sum()) == pytest.approx(1.0), params
        assert 0 <= sampler(logits, history) < 100
    broken = logits.clone()
    broken[3] = float("nan")
    assert Sampler(SamplingParams(temperature=1.0, seed=1))(broken) == 99  # NaN is -inf, then argmax

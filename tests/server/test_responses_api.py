"""POST /v1/responses against the real server, with the thinking, tool-aware chat template of
test_reasoning.py: responses and every stream event validate against the openai SDK's own types, a
constrained function call's arguments validate against its schema (the `jsonschema` package), text
and reasoning equal gufo's Engine run on the prompt written here by hand, a tool result round trip
(explicit items and previous_response_id) renders as written, and bad input is a 400 naming the field."""

from __future__ import annotations

import json
import urllib.request

import jsonschema
import pytest
from openai.types.responses import (
    Response,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseReasoningItem,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from gufo.engine.sampling import SamplingParams
from gufo.server.settings import ServerSettings
from tests.conftest import HANG_GUARD_S
from tests.server.conftest import MODEL, assert_error, live_server, load_engine
from tests.server.test_reasoning import TEMPLATE

MAX_TOKENS = 10
CALL_TOKENS = 64  # a call of get_weather takes about 50 of smollm2's tokens
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
# As the OpenAI Agents SDK sends a forced call: message items, a function tool. The template opens a
# thought, but the call's grammar holds from the first token: the reply is the call.
AGENT_CALL = {
    "model": MODEL,
    "input": [{"role": "user", "content": "Weather in Paris?"}],
    "tools": [WEATHER],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "text": {"verbosity": "medium"},
    "temperature": 0,
    "max_output_tokens": CALL_TOKENS,
    "metadata": {"run": "1"},
}
ASKED = "<|im_start|>system\nTools: get_weather<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
NO_THOUGHT = "<think>\n\n</think>\n\n"  # the template's generation prompt with enable_thinking false
REPLY_OFF = {"tool_choice": "auto", "max_output_tokens": MAX_TOKENS, "reasoning": {"effort": "none"}}
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(MODEL, max_tokens=CALL_TOKENS, chat_template=TEMPLATE)
    with live_server(settings, lambda: load_engine(1)) as live:
        yield live


def greedy_text(engine, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    tok = engine.tokenizer
    ids = tok.encode(prompt, add_special=True, parse_special=True)
    out = engine.generate(ids, max_tokens, SamplingParams(temperature=0)).generated_ids
    return tok.decode([t for t in out if t not in tok.eog_ids])


def prompt_tokens(engine, prompt: str) -> int:
    return len(engine.tokenizer.encode(prompt, add_special=True, parse_special=True))


def create(server, body: dict) -> Response:
    status, raw = server.request("POST", "/v1/responses", body)
    assert status == 200, raw
    return Response.model_validate(raw)  # validated, where the client only constructs


def stream(server, body: dict) -> list:
    """Every event of a streamed response, validated against the SDK's union of stream events; each
    `event:` line names its data's type."""
    data = json.dumps({**body, "stream": True}).encode()
    request = urllib.request.Request(server.base_url + "/v1/responses", data=data, method="POST")
    with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        blocks = response.read().decode().strip().split("\n\n")
    events = []
    for block in blocks:
        name, payload = block.split("\n")
        event = EVENTS.validate_python(json.loads(payload.removeprefix("data: ")))
        assert name == f"event: {event.type}"
        events.append(event)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def test_function_call_whole_and_streamed(server, reference_engine):
    response = create(server, AGENT_CALL)
    assert response.status == "completed" and response.object == "response" and response.error is None
    [call] = response.output
    assert isinstance(call, ResponseFunctionToolCall) and call.status == "completed"
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert response.model == MODEL and response.tool_choice == "required"
    assert response.parallel_tool_calls is False and response.metadata == {"run": "1"}
    assert response.max_output_tokens == CALL_TOKENS and response.temperature == 0 and response.store is True
    assert [t.name for t in response.tools] == ["get_weather"] and response.text.format.type == "text"
    usage = response.usage
    assert usage.input_tokens == prompt_tokens(reference_engine, ASKED + "<|im_start|>assistant\n<think>\n")
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0

    events = stream(server, AGENT_CALL)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    added, delta, done, item_done, completed = events[2:]
    assert added.item.arguments == "" and added.item.status == "in_progress"
    assert delta.delta == done.arguments == call.arguments  # greedy: the same call as the whole reply
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id
    assert item_done.item.name == call.name and item_done.item.status == "completed"
    assert completed.response.output == [item_done.item] and completed.response.id == events[0].response.id
    assert completed.response.usage.output_tokens == usage.output_tokens

    # the call's result through the store: previous_response_id continues the stored conversation
    rendered = json.dumps({"name": "get_weather", "arguments": json.loads(call.arguments)})  # as tojson
    prompt = (
        f"{ASKED}<|im_start|>assistant\n<tool_call>{rendered}</tool_call><|im_end|>\n"
        "<|im_start|>tool\n18 C, sunny<|im_end|>\n"
        f"<|im_start|>assistant\n{NO_THOUGHT}"
    )
    text = greedy_text(reference_engine, prompt)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 C, sunny"}
    body = {**AGENT_CALL, **REPLY_OFF, "input": [result]}
    again = create(server, {**body, "previous_response_id": response.id})
    assert again.output_text == text and again.previous_response_id == response.id
    assert again.usage.input_tokens == prompt_tokens(reference_engine, prompt)
    status, stored = server.request("GET", f"/v1/responses/{again.id}")
    assert status == 200 and Response.model_validate(stored) == again


def test_codex_shaped_stream_of_reasoning(server, reference_engine):
    """As Codex CLI sends it: instructions, input_text parts, a non-strict tool, reasoning, store false,
    include, prompt_cache_key, client_metadata. The thought runs past max_output_tokens, so the
    response is incomplete."""
    prompt = (
        "<|im_start|>system\nTools: shell<|im_end|>\n"
        "<|im_start|>system\nYou are a coding agent.<|im_end|>\n"
        "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    text = greedy_text(reference_engine, prompt)
    assert text and "</think>" not in text
    shell = {
        "type": "function",
        "name": "shell",
        "description": "Runs a command",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        },
    }
    body = {
        "model": MODEL,
        "instructions": "You are a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Why is the sky blue?"}],
            }
        ],
        "tools": [shell],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-1",
        "client_metadata": {"originator": "codex_cli_rs"},
        "temperature": 0,
        "max_output_tokens": MAX_TOKENS,
    }
    events = stream(server, body)
    deltas = [e for e in events if e.type == "response.reasoning_text.delta"]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.reasoning_text.delta"] * len(deltas),
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert "".join(e.delta for e in deltas) == text == events[-4].text
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    [thought] = final.output
    assert isinstance(thought, ResponseReasoningItem) and thought.status == "incomplete"
    assert thought.content[0].text == text and thought.id == deltas[0].item_id
    assert final.usage.output_tokens == MAX_TOKENS
    assert final.usage.input_tokens == prompt_tokens(reference_engine, prompt)
    assert final.instructions == "You are a coding agent." and final.store is False
    status, body = server.request("GET", f"/v1/responses/{final.id}")  # store false: not kept
    assert_error(status, body, 404, "not_found")


def test_tool_result_round_trip_renders(server, reference_engine):
    arguments = '{"city": "Paris"}'
    call_turn = f'<tool_call>{{"name": "get_weather", "arguments": {arguments}}}</tool_call>'
    prompt = (
        f"{ASKED}<|im_start|>assistant\n{call_turn}<|im_end|>\n"
        "<|im_start|>tool\n18 C, sunny<|im_end|>\n"
        f"<|im_start|>assistant\n{NO_THOUGHT}"
    )
    text = greedy_text(reference_engine, prompt)
    assert text and "<tool_call>" not in text  # the oracle's reply is plain content, no call to parse
    # the earlier turn's output items as a client replays them; its thought stays out of the prompt
    thought = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "Hm."}],
    }
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments}
    call |= {"id": "fc_1", "status": "completed"}
    result = {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": [{"type": "input_text", "text": "18 C, sunny"}],
    }
    common = {**AGENT_CALL, **REPLY_OFF}
    response = create(server, {**common, "input": [*AGENT_CALL["input"], thought, call, result]})
    [message] = response.output
    assert isinstance(message, ResponseOutputMessage) and message.role == "assistant"
    assert message.content[0].text == text and message.content[0].type == "output_text"
    assert response.usage.input_tokens == prompt_tokens(reference_engine, prompt)


def test_json_schema_text_format(server):
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 1},
        },
        "required": ["color", "count"],
        "additionalProperties": False,
    }
    form = {"type": "json_schema", "name": "paint", "schema": schema, "strict": True}
    body = {
        "model": MODEL,
        "input": "Pick a paint as JSON.",
        "text": {"format": form},
        "max_output_tokens": 32,
    }
    response = create(server, {**body, "reasoning": {"effort": "minimal"}, "temperature": 0})
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), schema)
    assert response.text.format.type == "json_schema" and response.text.format.name == "paint"


BAD_INPUT = [
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input.0.content.0.type",
    ),
    ({"input": [{"role": "critic", "content": "x"}]}, "input.0.role"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]}, "input.0.call_id"),
    ({"input": []}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "x", "tools": [{**WEATHER, "name": "no spaces"}]}, "tools.0.name"),
    ({"input": "x", "tools": [{**WEATHER, "parameters": {"type": "objekt"}}]}, "tools.0.parameters"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format"),
    (
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"not": {}}}}},
        "text.format",
    ),
    ({"input": "x", "previous_response_id": "resp_missing"}, "previous_response_id"),
    ({"input": "x", "max_output_tokens": CALL_TOKENS + 1}, "max_output_tokens"),
    ({"input": "x", "include": ["message.output_text.logprobs"]}, "include.0"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"input": "x", "stream_options": {"include_obfuscation": False}}, "stream_options"),
]


@pytest.mark.parametrize("body,param", BAD_INPUT, ids=[param for _, param in BAD_INPUT])
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    status, answer = server.request("POST", "/v1/responses", {"model": MODEL, **body})
    error = assert_error(status, answer, 400)
    assert error["param"] == param and error["message"].startswith(f"{param}: ")

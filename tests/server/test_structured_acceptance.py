"""Issue 28's acceptance set for structured output and tool calls, on both real models: 20 schemas of
varied shape, greedy and sampled, one at a time and 8 at once, each output validated with `jsonschema`;
`json_object` parses; tool_choice "required" and a named function give calls whose arguments validate,
streamed and whole alike. Minutes on a CPU, so it runs only with GUFO_ACCEPTANCE=1 (README, tests)."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from gufo.engine.engine import Engine
from gufo.options import RunOptions
from gufo.server.settings import ServerSettings
from tests.server.conftest import live_server

pytestmark = pytest.mark.skipif(
    os.environ.get("GUFO_ACCEPTANCE") != "1", reason="the acceptance set runs with GUFO_ACCEPTANCE=1"
)

MAX_TOKENS = 96
CONCURRENT = 8


def obj(properties: dict, required: list[str] | None = None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


SHORT = {"type": "string", "minLength": 1, "maxLength": 10}
SCHEMAS = [
    obj({"answer": {"enum": ["yes", "no"]}}),
    obj({"count": {"type": "integer", "minimum": 0, "maximum": 10}}),
    obj({"score": {"type": "number", "minimum": 0, "maximum": 1}}),
    obj({"ok": {"type": "boolean"}, "note": SHORT}),
    obj({"name": SHORT, "age": {"type": "integer", "minimum": 1, "maximum": 120}}),
    obj(
        {
            "pet": obj(
                {
                    "kind": {"enum": ["cat", "dog", "bird"]},
                    "age": {"type": "integer", "minimum": 0, "maximum": 30},
                }
            )
        }
    ),
    obj({"a": obj({"b": obj({"c": {"type": "integer", "minimum": 0, "maximum": 9}})})}),
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -5, "maximum": 5},
        "minItems": 2,
        "maxItems": 4,
    },
    obj({"tags": {"type": "array", "items": SHORT, "maxItems": 3}}),
    obj(
        {
            "points": {
                "type": "array",
                "items": obj(
                    {
                        "x": {"type": "integer", "minimum": 0, "maximum": 9},
                        "y": {"type": "integer", "minimum": 0, "maximum": 9},
                    }
                ),
                "minItems": 1,
                "maxItems": 2,
            }
        }
    ),
    obj({"level": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5}}),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}),
    obj({"date": {"type": "string", "format": "date"}}),
    obj({"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]}}),
    obj({"kind": {"const": "point"}, "x": {"type": "integer", "minimum": 0, "maximum": 99}}),
    obj({"name": SHORT, "nickname": SHORT}, required=["name"]),
    obj(
        {
            "user": obj(
                {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "roles": {
                        "type": "array",
                        "items": {"enum": ["admin", "user"]},
                        "minItems": 1,
                        "maxItems": 2,
                    },
                }
            )
        }
    ),
    {
        "$defs": {"digit": {"type": "integer", "minimum": 0, "maximum": 9}},
        **obj({"d1": {"$ref": "#/$defs/digit"}, "d2": {"$ref": "#/$defs/digit"}}),
    },
    obj({"temperature": {"type": "number", "minimum": -50, "maximum": 50}, "unit": {"enum": ["C", "F"]}}),
]
# A function's parameters are an object: the 18 object schemas above and two shaped like tools' own.
TOOL_SCHEMAS = [s for s in SCHEMAS if s.get("type") == "object"] + [
    obj(
        {
            "query": SHORT,
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
            "sort": {"enum": ["asc", "desc"]},
        }
    ),
    obj(
        {
            "items": {
                "type": "array",
                "items": obj({"sku": SHORT, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}),
                "minItems": 1,
                "maxItems": 2,
            },
            "express": {"type": "boolean"},
        }
    ),
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": f"tool_{index}", "description": f"Tool {index}", "parameters": schema},
    }
    for index, schema in enumerate(TOOL_SCHEMAS)
]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "Answer with JSON."}]


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def served(request):
    model = request.param

    def load() -> Engine:
        return Engine(model, options=RunOptions(threads=1), context=4096, n_slots=CONCURRENT)

    with live_server(ServerSettings(model, max_tokens=MAX_TOKENS), load) as live:
        yield model, live.client()


def structured(served, index: int, **sampling) -> None:
    model, client = served
    reply = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": f"s{index}", "schema": SCHEMAS[index], "strict": True},
        },
        **sampling,
    )
    assert reply.choices[0].finish_reason == "stop", (index, reply.choices[0])
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMAS[index])


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}], ids=["greedy", "sampled"]
)
def test_json_schema_single_and_concurrent(served, sampling):
    for index in range(len(SCHEMAS)):
        structured(served, index, **sampling)
    with ThreadPoolExecutor(CONCURRENT) as pool:
        for future in [pool.submit(structured, served, index, **sampling) for index in range(len(SCHEMAS))]:
            future.result()


def test_json_object_parses(served):
    model, client = served
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Give two colors and their counts as JSON."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    # The object closes within max_tokens: by the model, or as the budget runs out (gemma3, a base model,
    # repeats its last member until then); finish_reason says which.
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" or reply.usage.completion_tokens == MAX_TOKENS, choice
    assert isinstance(json.loads(choice.message.content), dict), choice


def test_tool_calls_validate_and_stream_the_same(served):
    model, client = served
    for name in PARAMETERS:
        for choice in ("required", {"type": "function", "function": {"name": name}}):
            common = {
                "model": model,
                "messages": MESSAGES,
                "tools": TOOLS,
                "tool_choice": choice,
                "temperature": 0,
                "max_tokens": MAX_TOKENS,
            }
            reply = client.chat.completions.create(**common)
            assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0]
            calls = [
                (c.function.name, json.loads(c.function.arguments))
                for c in reply.choices[0].message.tool_calls
            ]
            for called, arguments in calls:
                assert choice == "required" or called == name
                jsonschema.validate(arguments, PARAMETERS[called])
            chunks = client.chat.completions.create(stream=True, **common)
            streamed = [
                c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
            ]
            assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed] == calls

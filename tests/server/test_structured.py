"""Structured output and tool calling through the official openai client against the real server and
smollm2's own chat template: every output validates against its schema with the `jsonschema` package
(the oracle), greedy and sampled, and concurrently; constrained tool calls name a given function and
their arguments validate; a stream gives the same calls as a whole reply; json_object numbers are ones
a double holds; bad schemas are 400s naming the field."""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from gufo.server.settings import ServerSettings
from tests.engine.test_json_object import number_literals, survives_a_double
from tests.server.conftest import MODEL, assert_error, live_server, load_engine

CHAT = "/v1/chat/completions"
MAX_TOKENS = 64  # every schema below has a short value; a reply that needs more fails the finish check

# Varied shapes with short values: a nested object with an enum and integer bounds, an array of enums,
# bounded short strings with exclusive number bounds and a boolean.
SCHEMAS = {
    "pet": {
        "type": "object",
        "properties": {
            "pet": {
                "type": "object",
                "properties": {
                    "kind": {"enum": ["cat", "dog", "bird"]},
                    "age": {"type": "integer", "minimum": 1, "maximum": 20},
                },
                "required": ["kind", "age"],
                "additionalProperties": False,
            }
        },
        "required": ["pet"],
        "additionalProperties": False,
    },
    "colors": {
        "type": "array",
        "items": {"type": "string", "enum": ["red", "green", "blue"]},
        "minItems": 1,
        "maxItems": 3,
    },
    "player": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 8},
            "level": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
            "active": {"type": "boolean"},
        },
        "required": ["name", "level", "active"],
        "additionalProperties": False,
    },
}
PROMPTS = {
    "pet": "Describe a pet as JSON.",
    "colors": "List some colors as JSON.",
    "player": "Make up a game player as JSON.",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 12},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two small numbers",
            "parameters": {  # a $ref resolves inside the parameters, not the call around them
                "$defs": {"small": {"type": "integer", "minimum": 0, "maximum": 99}},
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/small"}, "b": {"$ref": "#/$defs/small"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
PARAMETERS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    with live_server(ServerSettings(MODEL, max_tokens=64), lambda: load_engine(3)) as live:
        yield live


def structured(client, name: str, **sampling) -> str:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPTS[name]}],
        max_tokens=MAX_TOKENS,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True},
        },
        **sampling,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice  # the grammar ended the reply, not max_tokens
    return choice.message.content


def test_json_schema_output_validates_greedy_and_sampled_concurrently(server):
    client = server.client()
    for name, schema in SCHEMAS.items():
        jsonschema.validate(json.loads(structured(client, name, temperature=0)), schema)
    # Sampled hot, three requests at once (one batch of three rows, each its own matcher).
    with ThreadPoolExecutor(3) as pool:
        futures = {
            name: pool.submit(structured, client, name, temperature=1.0, seed=index)
            for index, name in enumerate(SCHEMAS)
        }
        for name, future in futures.items():
            jsonschema.validate(json.loads(future.result()), SCHEMAS[name])


def json_object(server, prompt: str) -> str:
    """The content of a greedy json_object reply, which the grammar ended (not max_tokens)."""
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    return reply.choices[0].message.content


def test_json_object_output_is_an_object(server):
    assert isinstance(json.loads(json_object(server, "Give two colors and their counts as JSON.")), dict)


@pytest.mark.parametrize(
    "sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 3}], ids=["greedy", "sampled"]
)
def test_json_object_cut_by_max_tokens_still_parses(server, sampling):
    """Budgets too short for the whole object: the reply closes within them (`json` the oracle), its
    finish_reason "length" where the budget ended it, and streams the same text as it answers whole;
    some of them do run to the budget (so the closing, not the model, ended them)."""
    client = server.client()
    lengths = 0
    for budget in (3, 6, 11, 17):
        common = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Describe a cat in JSON with many fields."}],
            "max_tokens": budget,
            "response_format": {"type": "json_object"},
            **sampling,
        }
        reply = client.chat.completions.create(**common)
        choice = reply.choices[0]
        assert isinstance(json.loads(choice.message.content), dict), (budget, choice)
        assert reply.usage.completion_tokens <= budget
        assert choice.finish_reason == "stop" or reply.usage.completion_tokens == budget, choice
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(**common, stream=True)
            if chunk.choices
        )
        assert streamed == choice.message.content
        lengths += choice.finish_reason == "length"
    assert lengths >= 1


def test_json_object_numbers_are_ones_a_double_holds(server):
    """Asked for 40 decimals of pi, the model gets the 15 digits a double holds: `json` reads the literal
    back, equal to pi to 15 significant digits (math.pi the oracle), and the object closes."""
    literals = number_literals(json_object(server, "Give the value of pi to 40 decimal places as JSON."))
    assert format(math.pi, ".15g") in literals and all(survives_a_double(x) for x in literals), literals


def calls_of(message) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls]


def test_required_and_named_tool_calls_validate_and_stream_the_same(server):
    client = server.client()
    for choice, allowed in (
        ("required", set(PARAMETERS)),
        ({"type": "function", "function": {"name": "add"}}, {"add"}),
    ):
        common = {"model": MODEL, "tools": TOOLS, "tool_choice": choice, "max_tokens": MAX_TOKENS}
        reply = client.chat.completions.create(messages=WEATHER, temperature=0, **common)
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = calls_of(reply.choices[0].message)
        assert len(calls) == 1 and reply.choices[0].message.tool_calls[0].id.startswith("call_")
        for name, arguments in calls:
            assert name in allowed
            jsonschema.validate(arguments, PARAMETERS[name])
        chunks = list(client.chat.completions.create(messages=WEATHER, temperature=0, stream=True, **common))
        streamed = [
            call for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or []
        ]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in streamed] == calls
        assert [c.index for c in streamed] == [0]
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    sampled = client.chat.completions.create(
        messages=WEATHER, temperature=1.0, seed=3, **{**common, "tool_choice": "required"}
    )
    for name, arguments in calls_of(sampled.choices[0].message):
        jsonschema.validate(arguments, PARAMETERS[name])


def test_bad_schemas_and_tool_choices_are_400s_naming_the_field(server):
    def chat(**fields) -> dict:
        body = {"model": MODEL, "messages": WEATHER, "max_tokens": 2, **fields}
        return assert_error(*server.request("POST", CHAT, body), 400)

    def schema_format(schema: dict) -> dict:
        return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}

    error = chat(response_format=schema_format({"type": "strnig"}))
    assert error["param"] == "response_format" and "/type" in error["message"]
    error = chat(response_format=schema_format({"type": "array", "uniqueItems": True}))
    assert error["param"] == "response_format" and "uniqueItems" in error["message"]
    error = chat(response_format=schema_format({"type": "integer", "minimum": 5, "maximum": 1}))
    assert error["param"] == "response_format" and "minimum" in error["message"]
    bad_tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "required": 3}},
    }
    error = chat(tools=[TOOLS[0], bad_tool])
    assert error["param"] == "tools.1.function.parameters"
    error = chat(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert error["param"] == "tool_choice" and "nope" in error["message"]
    error = chat(tool_choice="required")
    assert error["param"] == "tool_choice"
    error = chat(chat_template_kwargs={"messages": []})
    assert error["param"] == "chat_template_kwargs"


# GBNF as llama.cpp writes it: alternatives, a character class with a bounded repeat.
ANSWER = 'root ::= ("yes" | "no") "."'
CODE = 'root ::= [0-9]{3} "-" code\ncode ::= [a-z] | [a-z] [a-z]'
# The same grammars in Lark (no `::=` on any line: vLLM's rule), starting at `start`.
ANSWER_LARK = 'start: ("yes" | "no") "."'
CODE_LARK = 'start: /[0-9]{3}/ "-" /[a-z]{1,2}/'


@pytest.mark.parametrize(("answer", "code"), [(ANSWER, CODE), (ANSWER_LARK, CODE_LARK)], ids=["gbnf", "lark"])
def test_client_grammar_holds_in_chat_and_completions(server, answer, code):
    client = server.client()
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is the sky blue?"}],
        max_tokens=8,
        temperature=0,
        extra_body={"grammar": answer},  # llama-server's field
    )
    assert reply.choices[0].message.content in ("yes.", "no.") and reply.choices[0].finish_reason == "stop"
    # vLLM's field on completions, two prompts sampled hot at once: each its own matcher
    completion = client.completions.create(
        model=MODEL,
        prompt=["Code:", "Another code:"],
        max_tokens=12,  # at most a token per character and the end-of-generation token
        temperature=1.0,
        seed=5,
        extra_body={"structured_outputs": {"grammar": code}},
    )
    assert len(completion.choices) == 2
    for choice in completion.choices:
        assert re.fullmatch(r"[0-9]{3}-[a-z]{1,2}", choice.text) and choice.finish_reason == "stop", choice


def test_bad_grammars_are_400s_naming_the_field(server):
    def post(path: str, **fields) -> dict:
        body = {"model": MODEL, "max_tokens": 2, **fields}
        return assert_error(*server.request("POST", path, body), 400)

    error = post(CHAT, messages=WEATHER, grammar="root ::= answer")
    assert error["param"] == "grammar" and 'Rule "answer" is not defined' in error["message"]
    error = post("/v1/completions", prompt="x", structured_outputs={"grammar": 'root ::= "open'})
    assert error["param"] == "structured_outputs.grammar" and "line 1" in error["message"]
    error = post("/v1/completions", prompt="x", structured_outputs={"grammar": 'start ::= "x"'})
    assert error["param"] == "structured_outputs.grammar" and '"root"' in error["message"]
    error = post("/v1/completions", prompt="x", structured_outputs={"regex": "[0-9]+"})
    assert error["param"] == "structured_outputs.regex"
    error = post(CHAT, messages=WEATHER, grammar='start: ("yes" | "no"')  # Lark, one line naming where
    assert error["param"] == "grammar" and error["message"].startswith("grammar: invalid Lark grammar: ")
    assert "line 1, column" in error["message"] and "\n" not in error["message"]
    error = post(CHAT, messages=WEATHER, grammar=ANSWER, response_format={"type": "json_object"})
    assert error["param"] == "grammar" and "response_format" in error["message"]
    error = post(CHAT, messages=WEATHER, grammar=ANSWER, tools=TOOLS, tool_choice="required")
    assert error["param"] == "grammar" and "tool_choice" in error["message"]
    error = post(CHAT, messages=WEATHER, grammar=ANSWER, structured_outputs={"grammar": ANSWER})
    assert error["param"] == "structured_outputs"

"""The reply parser on hand-written replies cut into arbitrary stream pieces: the reasoning, content and
tool calls are those written by hand, however the text is split."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gufo.server.reply import ReplyParser

NAMES = frozenset({"get_weather", "add"})
CALLS = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>'
)


def pieces(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def run(parser: ReplyParser, parts: list[str]) -> tuple[dict[str, str], list[dict]]:
    fields: dict[str, str] = {}
    deltas = [d for part in parts for d in parser.push(part)]
    more, calls = parser.finish()
    for delta in deltas + more:
        for name, value in delta.items():
            fields[name] = fields.get(name, "") + value
    return fields, calls


@settings(max_examples=40)
@given(st.lists(st.integers(0, 200), max_size=8))
def test_thoughts_split_from_content_however_streamed(cuts):
    text = "\n<think>\nsky: Rayleigh</think>\n\nBlue light scatters."
    fields, calls = run(ReplyParser(thinking=True), pieces(text, cuts))
    assert (
        fields == {"reasoning_content": "\nsky: Rayleigh", "content": "Blue light scatters."} and calls == []
    )
    # A generation prompt that opened the thought already: the text starts inside it.
    fields, _ = run(ReplyParser(thinking=True, in_thought=True), pieces("plan</think>done", cuts))
    assert fields == {"reasoning_content": "plan", "content": "done"}
    # A template that does not think leaves "<think>" in the content.
    fields, _ = run(ReplyParser(), pieces(text, cuts))
    assert fields == {"content": text}


@settings(max_examples=40)
@given(st.lists(st.integers(0, 300), max_size=8))
def test_hermes_calls_are_parsed_however_streamed(cuts):
    fields, calls = run(ReplyParser(tool_names=NAMES), pieces(CALLS, cuts))
    assert fields == {"content": "Let me check."}
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {"a": 1, "b": 2}),
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    _, first = run(ReplyParser(tool_names=NAMES, one_call=True), pieces(CALLS, cuts))
    assert [c["function"]["name"] for c in first] == ["get_weather"]  # parallel_tool_calls false


def test_generic_json_fallback_and_unknown_names():
    fenced = '```json\n{"name": "add", "parameters": {"a": 3, "b": 4}}\n```'
    fields, calls = run(ReplyParser(tool_names=NAMES), [fenced])
    assert fields == {} and json.loads(calls[0]["function"]["arguments"]) == {"a": 3, "b": 4}
    unknown = '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'
    fields, calls = run(ReplyParser(tool_names=NAMES), [unknown])
    assert fields == {"content": unknown} and calls == []

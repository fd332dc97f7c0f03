"""A chat reply's text -> what OpenAI's message has: `reasoning_content` (a thinking template's
`<think>…</think>`), `content`, and `tool_calls` parsed out of the text.

Tool calls are hermes-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5/Qwen3 and
the format gufo describes to templates that know no tools), or, as a fallback, a reply that is just one
such JSON object (in a ```json fence or not) naming a known function. While tools are offered the
content is held until the reply ends, so a streamed reply and a whole one give the same calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
HERMES_CALL = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(CALL_CLOSE), re.DOTALL)
FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def held_prefix(text: str, tag: str) -> int:
    """How many trailing characters of `text` could begin `tag` (held back until known)."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


@dataclass
class ReplyParser:
    """`thinking`: the template thinks; `in_thought`: its generation prompt already opened `<think>`;
    `tool_names`: the functions offered (None: no tools, the content streams as it comes);
    `one_call`: parallel_tool_calls is false, so only the first call counts."""

    thinking: bool = False
    in_thought: bool = False
    tool_names: frozenset[str] | None = None
    one_call: bool = False
    _held: str = ""
    _content: list[str] = field(default_factory=list)
    _seen_text: bool = False
    _after_thought: bool = False  # the newlines that follow `</think>` are the template's, not content

    def push(self, text: str) -> list[dict]:
        """Delta fields to send now for a piece of text."""
        self._held += text
        return self._release(final=False)

    def finish(self) -> tuple[list[dict], list[dict]]:
        """The last delta fields and the tool calls, once the reply has ended."""
        deltas = self._release(final=True)
        if self.tool_names is None:
            return deltas, []
        content, calls = parse_tool_calls("".join(self._content), self.tool_names)
        if content:
            deltas.append({"content": content})
        return deltas, calls[:1] if self.one_call else calls

    def _release(self, final: bool) -> list[dict]:
        deltas: list[dict] = []
        while self._held:
            if self.thinking and not self.in_thought and not self._seen_text:
                stripped = self._held.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._held, self.in_thought = stripped[len(THINK_OPEN) :], True
                    continue
                if not final and THINK_OPEN.startswith(stripped):
                    break  # could still open a thought
            if self._after_thought:
                self._held = self._held.lstrip("\n")
                self._after_thought = not self._held
                continue
            tag = THINK_CLOSE if self.in_thought else None
            if tag is not None and tag in self._held:
                thought, self._held = self._held.split(tag, 1)
                self.in_thought, self._seen_text, self._after_thought = False, True, True
                if thought:
                    deltas.append({"reasoning_content": thought})
                continue
            keep = 0 if final or tag is None else held_prefix(self._held, tag)
            out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
            if out:
                if self.in_thought:
                    deltas.append({"reasoning_content": out})
                else:
                    self._seen_text = self._seen_text or bool(out.strip())
                    if self.tool_names is None:
                        deltas.append({"content": out})
                    else:
                        self._content.append(out)
            break
        return deltas


def parse_tool_calls(text: str, tool_names: frozenset[str]) -> tuple[str, list[dict]]:
    """The content left once the calls are taken out, and the calls in OpenAI's shape."""
    calls = [call for body in HERMES_CALL.findall(text) if (call := as_call(body, tool_names))]
    if calls:
        return HERMES_CALL.sub("", text).strip(), calls
    fenced = FENCE.match(text.strip())
    whole = as_call(fenced.group(1) if fenced else text.strip(), tool_names)
    return ("", [whole]) if whole else (text, [])


def as_call(body: str, tool_names: frozenset[str]) -> dict | None:
    try:
        value: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in tool_names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the JSON text already
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def describe_tools(tools: list[dict]) -> str:
    """The system text that offers `tools` to a template that renders none (hermes format, as Qwen2.5's
    template writes it)."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
        "</tools>\n\nFor each function call, return a json object with function name and arguments within "
        f'{CALL_OPEN}{CALL_CLOSE} XML tags:\n{CALL_OPEN}\n{{"name": <function-name>, "arguments": '
        f"<args-json-object>}}\n{CALL_CLOSE}"
    )


def call_text(call: dict) -> str:
    """An assistant turn's earlier call, written out for a template that renders no `tool_calls`."""
    function = call["function"]
    body = json.dumps({"name": function["name"], "arguments": function["arguments"]}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"

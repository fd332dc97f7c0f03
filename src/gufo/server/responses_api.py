"""POST /v1/responses (OpenAI's Responses API), on the chat completions' pipeline.

The request's input items (messages, function calls and their outputs; earlier reasoning is left out)
after its `instructions` become a chat conversation, and its tools, tool_choice, text.format,
max_output_tokens and sampling fields the matching chat fields, so the prompt, the grammar and the
parsing of tool calls are the chat completions' own; their errors name the Responses field. The
reply's thought, text and tool calls become output items (a `reasoning` item, a `message` with one
`output_text` part, `function_call` items), built by one `OutputBuilder` whether streamed or not; a
stream sends OpenAI's typed events with consecutive `sequence_number`s. A stored response (`store`,
true unless sent false, as OpenAI has it) keeps its conversation in memory, the last STORED_RESPONSES
of them, for `previous_response_id` and GET /v1/responses/{id}.
"""

from __future__ import annotations

import copy
import json
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from gufo.server.reply import ReplyParser
from gufo.server.responses import ApiError, Generation, invalid_request
from gufo.server.responses_schema import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    MessageItem,
    ResponsesRequest,
    joined,
)
from gufo.server.schemas import ChatCompletionRequest
from gufo.tokenizer import Tokenizer

STORED_RESPONSES = 256  # responses kept for previous_response_id; the oldest goes first

# A chat field named in an error -> the Responses field it came from.
RENAMED = (
    (re.compile(r"^messages\b[.\w]*"), "input"),
    (re.compile(r"^max_completion_tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format\b[.\w]*"), "text.format"),
    (re.compile(r"^tools\.(\d+)\.function\."), r"tools.\1."),
    (re.compile(r"^chat_template_kwargs$"), "reasoning"),
)


def renamed(err: ApiError) -> ApiError:
    """The chat pipeline's error with the Responses field's name."""
    if err.param is None:
        return err
    param = err.param
    for pattern, name in RENAMED:
        param = pattern.sub(name, param)
    message = err.message.removeprefix(f"{err.param}:")
    message = f"{param}:{message}" if message != err.message else message
    return ApiError(err.status, message, err.kind, param, err.code, err.headers)


class ResponseStore:
    """Stored responses and their conversations (chat messages, instructions left out), by id."""

    def __init__(self, capacity: int = STORED_RESPONSES):
        self.capacity = capacity
        self._stored: OrderedDict[str, tuple[dict, list[dict]]] = OrderedDict()

    def put(self, response: dict, conversation: list[dict]) -> None:
        self._stored[response["id"]] = (response, conversation)
        while len(self._stored) > self.capacity:
            self._stored.popitem(last=False)

    def response(self, response_id: str) -> dict:
        if response_id not in self._stored:
            message = f"no stored response with id '{response_id}'"
            raise ApiError(404, message, param="response_id", code="not_found")
        return self._stored[response_id][0]

    def conversation(self, response_id: str | None) -> list[dict]:
        if response_id is None:
            return []
        if response_id not in self._stored:
            message = f"previous_response_id: no stored response with id '{response_id}' (responses sent "
            message += f"with store=false are not kept, and only the last {self.capacity} are)"
            raise ApiError(400, message, param="previous_response_id", code="previous_response_not_found")
        return self._stored[response_id][1]


def conversation(body: ResponsesRequest, earlier: list[dict]) -> list[dict]:
    """`earlier` (a previous response's conversation) and the input items as chat messages: consecutive
    function calls join the assistant turn before them, each output answers a call made before it."""
    messages = list(earlier)
    names = {call["id"]: call["function"]["name"] for m in messages for call in m.get("tool_calls") or []}
    for index, item in enumerate(body.input_items()):
        if isinstance(item, MessageItem):
            messages.append({"role": item.role, "content": joined(item.content)})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            names[item.call_id] = item.name
            if messages and messages[-1]["role"] == "assistant":
                last = messages[-1] = dict(messages[-1])
                last["tool_calls"] = [*(last.get("tool_calls") or []), call]
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in names:
                param = f"input.{index}.call_id"
                message = f"{param}: no function_call with call_id '{item.call_id}' comes before this output"
                raise ApiError(400, message, param=param, code="invalid_value")
            name = names[item.call_id]
            messages.append(
                {"role": "tool", "content": joined(item.output), "tool_call_id": item.call_id, "name": name}
            )
    if not messages:
        raise ApiError(400, "input: no input items", param="input", code="invalid_value")
    return messages


def chat_request(body: ResponsesRequest, messages: list[dict]) -> ChatCompletionRequest:
    """The chat completions request that asks for the same reply."""
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": ([{"role": "system", "content": body.instructions}] if body.instructions else [])
        + messages,
        "max_completion_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "parallel_tool_calls": body.parallel_tool_calls,
    }
    tools = body.function_tools()
    if tools:
        fields["tools"] = [
            {"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in tools
        ]
    choice = body.tool_choice
    fields["tool_choice"] = (
        {"type": "function", "function": {"name": choice.name}}
        if isinstance(choice, FunctionChoice)
        else choice
    )
    form = body.text.format if body.text is not None else None
    if form is not None and form.type == "json_schema":
        schema = {"name": form.name or "response", "schema": form.schema_, "strict": form.strict}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif form is not None:
        fields["response_format"] = {"type": form.type}
    if body.reasoning is not None and not body.reasoning.thinks:
        fields["chat_template_kwargs"] = {"enable_thinking": False}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as err:
        raise renamed(invalid_request(err)) from None


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputBuilder:
    """The output items from a reply's fields (reasoning_content, content) and tool calls; each step
    returns the stream events it makes (without their sequence numbers)."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._open: dict | None = None  # the reasoning or message item text goes to
        self._text: list[str] = []

    def push(self, deltas: list[dict]) -> list[dict]:
        events: list[dict] = []
        for delta in deltas:
            for field_name, text in delta.items():
                kind = "reasoning" if field_name == "reasoning_content" else "message"
                if self._open is None or self._open["type"] != kind:
                    events += self._close("completed")
                    events += self._add(kind)
                self._text.append(text)
                events.append(self._event(f"response.{self._text_kind}.delta", delta=text))
                if kind == "message":
                    events[-1]["logprobs"] = []
        return events

    def finish(self, deltas: list[dict], calls: list[dict], status: str) -> list[dict]:
        """The last fields and the calls, once the reply has ended; `status` is every open item's."""
        events = self.push(deltas) + self._close(status)
        for call in calls:
            events += self._call(call, status)
        if not self.items:  # a reply of no text at all is one empty message
            events += self._add("message") + self._close(status)
        return events

    @property
    def _text_kind(self) -> str:
        return (
            "reasoning_text"
            if self._open is not None and self._open["type"] == "reasoning"
            else "output_text"
        )

    def _event(self, kind: str, **fields: Any) -> dict:
        item = self._open if self._open is not None else self.items[-1]
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        if kind.startswith(("response.content_part", "response.output_text", "response.reasoning_text")):
            where["content_index"] = 0
        return {"type": kind, **where, **fields}

    def _part(self) -> dict:
        text = "".join(self._text)
        if self._text_kind == "reasoning_text":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _add(self, kind: str) -> list[dict]:
        if kind == "reasoning":
            item = {
                "id": new_id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
        else:
            item = {
                "id": new_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
        self.items.append(item)
        self._open, self._text = item, []
        added = {
            "type": "response.output_item.added",
            "output_index": len(self.items) - 1,
            "item": copy.deepcopy(item),
        }
        return [added, self._event("response.content_part.added", part=self._part())]

    def _close(self, status: str) -> list[dict]:
        item = self._open
        if item is None:
            return []
        part = self._part()
        done = self._event(f"response.{self._text_kind}.done", text=part["text"])
        if part["type"] == "output_text":
            done["logprobs"] = []
        events = [done, self._event("response.content_part.done", part=part)]
        item["content"], item["status"] = [part], status
        events.append(
            {
                "type": "response.output_item.done",
                "output_index": len(self.items) - 1,
                "item": copy.deepcopy(item),
            }
        )
        self._open, self._text = None, []
        return events

    def _call(self, call: dict, status: str) -> list[dict]:
        function = call["function"]
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"],
            "status": status,
        }
        self.items.append(item)
        index = len(self.items) - 1
        where = {"item_id": item["id"], "output_index": index}
        return [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": index, "item": copy.deepcopy(item)},
        ]


def assistant_turn(items: list[dict]) -> dict:
    """The output items as the chat message a later turn's prompt renders (its thought left out)."""
    text = "".join(part["text"] for item in items if item["type"] == "message" for part in item["content"])
    calls = [
        {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]},
        }
        for item in items
        if item["type"] == "function_call"
    ]
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


class ResponseDraft:
    """One response's fixed fields (echoing the request's) and its end: usage, status, storing."""

    def __init__(
        self,
        body: ResponsesRequest,
        model_id: str,
        messages: list[dict],
        tokenizer: Tokenizer,
        store: ResponseStore,
    ):
        self.body, self.model_id, self.messages, self.tokenizer, self.store = (
            body,
            model_id,
            messages,
            tokenizer,
            store,
        )
        self.id = new_id("resp")
        self.created_at = int(time.time())

    def envelope(self, status: str, output: list[dict], **fields: Any) -> dict:
        body = self.body
        form = body.text.format if body.text is not None and body.text.format is not None else None
        if form is not None and form.type == "json_schema":
            text_format = {
                "type": "json_schema",
                "name": form.name or "response",
                "schema": form.schema_,
                "description": form.description,
                "strict": form.strict,
            }
        else:
            text_format = {"type": form.type if form is not None else "text"}
        choice = body.tool_choice
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": None,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {},
            "model": self.model_id,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning.model_dump() if body.reasoning is not None else None,
            "store": body.store,
            "temperature": body.temperature,
            "text": {"format": text_format, "verbosity": body.text.verbosity if body.text else None},
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
            "tools": [tool.model_dump() for tool in body.function_tools()],
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": body.user,
            **fields,
        }

    def done(self, generation: Generation, output: list[dict], status: str) -> dict:
        """The finished response (stored when asked for)."""
        usage = generation.usage()
        thought = "".join(
            part["text"] for item in output if item["type"] == "reasoning" for part in item["content"]
        )
        reasoning_tokens = (
            len(self.tokenizer.encode(thought, add_special=False, parse_special=False)) if thought else 0
        )
        response = self.envelope(
            status,
            output,
            completed_at=int(time.time()) if status == "completed" else None,
            incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
            usage={
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {
                    "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                    "cache_write_tokens": 0,
                },
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": usage["total_tokens"],
            },
        )
        if self.body.store:
            self.store.put(response, [*self.messages, assistant_turn(output)])
        return response


def status_of(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


async def collect_response(generation: Generation, draft: ResponseDraft, reply: ReplyParser) -> dict:
    builder = OutputBuilder()
    finish = None
    async for piece in generation.pieces():
        builder.push(reply.push(piece.text))
        finish = piece.finish
    builder.finish(*reply.finish(), status_of(finish))
    return draft.done(generation, builder.items, status_of(finish))


def typed_sse(event: dict) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


async def stream_response(
    generation: Generation, draft: ResponseDraft, reply: ReplyParser
) -> AsyncIterator[str]:
    """response.created and .in_progress, each item's events as its text comes, then
    response.completed (.incomplete when cut by max_output_tokens); an error: an error event and
    response.failed."""
    sequence = 0

    def numbered(event: dict) -> str:
        nonlocal sequence
        event["sequence_number"] = sequence
        sequence += 1
        return typed_sse(event)

    yield numbered({"type": "response.created", "response": draft.envelope("in_progress", [])})
    yield numbered({"type": "response.in_progress", "response": draft.envelope("in_progress", [])})
    builder = OutputBuilder()
    finish = None
    try:
        async for piece in generation.pieces():
            for event in builder.push(reply.push(piece.text)):
                yield numbered(event)
            finish = piece.finish
        for event in builder.finish(*reply.finish(), status_of(finish)):
            yield numbered(event)
        response = draft.done(generation, builder.items, status_of(finish))
        yield numbered({"type": f"response.{response['status']}", "response": response})
    except ApiError as err:  # headers are sent already: the error goes in the stream
        yield numbered(
            {"type": "error", "code": err.code or err.kind, "message": err.message, "param": err.param}
        )
        failed = draft.envelope(
            "failed", builder.items, error={"code": "server_error", "message": err.message}
        )
        yield numbered({"type": "response.failed", "response": failed})

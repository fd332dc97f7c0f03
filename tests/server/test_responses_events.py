"""The Responses API's output items and stream events from a reply's fields, without a model: every
event validates against the openai SDK's union of stream events, in OpenAI's order (an error mid-stream
too); and the chat pipeline's error fields renamed to the Responses ones."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.types.responses import ResponseOutputItem, ResponseStreamEvent
from pydantic import TypeAdapter

from gufo.server.reply import ReplyParser
from gufo.server.responses import ApiError, Piece
from gufo.server.responses_api import OutputBuilder, ResponseDraft, ResponseStore, renamed, stream_response
from gufo.server.responses_schema import ResponsesRequest

EVENTS = TypeAdapter(ResponseStreamEvent)
ITEMS = TypeAdapter(ResponseOutputItem)
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


def validated(events: list[dict]) -> list:
    return [EVENTS.validate_python({**event, "sequence_number": n}) for n, event in enumerate(events)]


def test_thought_text_and_call_become_three_items_in_order():
    builder = OutputBuilder()
    events = builder.push([{"reasoning_content": "Hm"}, {"reasoning_content": "m."}])
    events += builder.push([{"content": "Hi"}])
    events += builder.finish([{"content": "!"}], [CALL], "completed")
    typed = validated(events)
    part = ["response.output_item.added", "response.content_part.added"]
    closing = ["response.content_part.done", "response.output_item.done"]
    assert [e.type for e in typed] == [
        *part,
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        *closing,
        *part,
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        *closing,
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert [e.output_index for e in typed] == [0] * 7 + [1] * 7 + [2] * 4
    thought, message, call = (ITEMS.validate_python(item) for item in builder.items)
    assert thought.type == "reasoning" and thought.content[0].text == "Hmm." and thought.status == "completed"
    assert message.content[0].text == "Hi!" and message.status == "completed"
    assert call.call_id == "call_1" and call.name == "f" and call.arguments == '{"a": 1}'
    assert typed[2].item_id == thought.id and typed[9].item_id == message.id and typed[15].item_id == call.id
    assert typed[7].item.content == [] and typed[13].item.content[0].text == "Hi!"  # added empty, done whole


def test_an_empty_reply_is_one_empty_message_with_the_status():
    builder = OutputBuilder()
    typed = validated(builder.finish([], [], "incomplete"))
    assert [e.type for e in typed][-3:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    [message] = builder.items
    assert message["status"] == "incomplete" and message["content"][0]["text"] == ""


@pytest.mark.parametrize(
    "param,expected",
    [
        ("messages", "input"),
        ("messages.0.content", "input"),
        ("max_completion_tokens", "max_output_tokens"),
        ("response_format", "text.format"),
        ("tools.3.function.parameters", "tools.3.parameters"),
        ("tool_choice", "tool_choice"),
        ("chat_template_kwargs", "reasoning"),
    ],
)
def test_chat_fields_renamed(param, expected):
    err = renamed(ApiError(400, f"{param}: why", param=param, code="invalid_value"))
    assert (err.param, err.message, err.status, err.code) == (
        expected,
        f"{expected}: why",
        400,
        "invalid_value",
    )


class FailingGeneration:
    """A generation that releases one piece of text, then times out."""

    async def pieces(self):
        yield Piece("Hi", [])
        raise ApiError(504, "the request timed out (--request-timeout)", "timeout_error")


def test_an_error_mid_stream_is_an_error_event_then_response_failed():
    body = ResponsesRequest.model_validate({"input": "x", "stream": True})
    draft = ResponseDraft(body, "m", [], tokenizer=None, store=ResponseStore())

    async def events() -> list[str]:
        return [event async for event in stream_response(FailingGeneration(), draft, ReplyParser())]

    blocks = asyncio.run(events())
    typed = [EVENTS.validate_python(json.loads(block.split("data: ", 1)[1])) for block in blocks]
    assert [e.type for e in typed] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    assert [e.sequence_number for e in typed] == list(range(7))
    assert typed[5].code == "timeout_error" and "timed out" in typed[5].message
    failed = typed[6].response
    assert (
        failed.status == "failed"
        and failed.error.code == "server_error"
        and failed.id == typed[0].response.id
    )

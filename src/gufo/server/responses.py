"""OpenAI's response bodies, stream chunks (server-sent events) and error objects, from a job's events.

Generation runs on the scheduler's thread; a handler waits for its job's tokens on an asyncio queue
(`Generation`) and lays them out as one endpoint's JSON response or stream (`Shape`). An error once
a stream has begun goes in the stream, as an error event before [DONE].
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from gufo.server.reply import ReplyParser
from gufo.server.scheduler import FinishEvent, Job, Scheduler, TokenEvent
from gufo.server.text import TextStream
from gufo.tokenizer import Tokenizer


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """Answered with `status` and OpenAI's error object."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        body = error_body(self.message, self.kind, self.param, self.code)
        return JSONResponse(body, self.status, headers=self.headers)


SCALAR_MEMBERS = ("str", "int", "float", "bool")  # how pydantic names these members of a union


def invalid_request(err: ValidationError, where: tuple[str | int, ...] = ()) -> ApiError:
    """A 400 naming the first field pydantic refused (`where`: the path of the part it validated)."""
    errors = err.errors()
    first = errors[0]
    if first["type"] == "json_invalid":
        return ApiError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', '')}")
    loc = (*where, *deepest_member(errors)["loc"])
    param = ".".join(str(part) for part in loc if not is_union_member(part)) or None
    reason = "unsupported parameter" if first["type"] == "extra_forbidden" else first["msg"]
    message = f"{param}: {reason}" if param else f"request body: {reason}"
    return ApiError(400, message, param=param, code="invalid_value")


def deepest_member(errors: list[dict]) -> dict:
    """The first error, or, when it says a union's string (or number) member did not match, the error
    of its list or object member at the same place: for `str | list[Part]`, that a part's field is
    wrong, not that the list is no string."""
    first = errors[0]
    *place, member = first["loc"] or ("",)
    if member not in SCALAR_MEMBERS:
        return first
    n = len(place)
    deeper = [e for e in errors[1:] if len(e["loc"]) > n + 1 and list(e["loc"][:n]) == place]
    return deeper[0] if deeper else first


def is_union_member(loc_part: str | int) -> bool:
    """pydantic tags an error inside `str | list[int]` with the member's type ('str', 'list[int]'); the
    client named a field, not a type."""
    return isinstance(loc_part, str) and (loc_part in SCALAR_MEMBERS or "[" in loc_part)


@dataclass
class Piece:
    """Text released to the client and the tokens it came from; `finish` on the last one."""

    text: str
    tokens: list[TokenEvent]
    finish: str | None = None


class Generation:
    """The handler's side of one job: pieces of text as they are released, then usage and timings."""

    def __init__(
        self, scheduler: Scheduler, job: Job, text: TextStream, timeout: float | None, echo: str = ""
    ):
        """`timeout`: seconds the whole job may take (--request-timeout); `echo`: text released before
        the first generated piece."""
        self.scheduler, self.job, self.text, self.echo = scheduler, job, text, echo
        self.deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        self.tokens: list[TokenEvent] = []

    async def _next_event(self) -> TokenEvent | FinishEvent:
        if self.deadline is None:
            return await self.job.events.get()
        remaining = self.deadline - asyncio.get_running_loop().time()
        try:
            return await asyncio.wait_for(self.job.events.get(), max(remaining, 0.0))
        except TimeoutError:
            raise ApiError(504, "the request timed out (--request-timeout)", "timeout_error") from None

    async def pieces(self) -> AsyncIterator[Piece]:
        pending: list[TokenEvent] = []
        try:
            if self.echo:
                yield Piece(self.echo, [])
            while True:
                event = await self._next_event()
                if isinstance(event, FinishEvent):
                    if event.error is not None:
                        kind = "unavailable_error" if event.status == 503 else "server_error"
                        raise ApiError(event.status, event.error, kind, code=event.code)
                    yield Piece(self.text.finish(), pending, event.reason)
                    return
                self.tokens.append(event)
                pending.append(event)
                delta = self.text.push(event.token)
                if self.text.stopped:
                    self.scheduler.cancel(self.job, "stop")  # a stop string: finished, not cancelled
                    yield Piece(delta, pending, "stop")
                    return
                if delta:
                    yield Piece(delta, pending)
                    pending = []
        finally:  # frees the slot after a stop string, a timeout or a disconnect; no-op once finished
            self.scheduler.cancel(self.job)

    def usage(self) -> dict:
        prompt = len(self.job.prompt_ids)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": len(self.tokens),
            "total_tokens": prompt + len(self.tokens),
            "prompt_tokens_details": {"cached_tokens": self.job.cached_tokens},
        }

    def timings(self) -> dict:
        """llama.cpp's names. The first token comes from the prefill's logits, so generation speed
        counts the decode steps after it (as `gufo run` does)."""
        job = self.job
        evaluated = len(job.prompt_ids) - job.cached_tokens
        prompt_s = job.prompt_seconds if self.tokens else 0.0
        predicted_s = self.tokens[-1].time - job.first_token_at if self.tokens else 0.0
        return {
            "cache_n": job.cached_tokens,
            "prompt_n": evaluated,
            "prompt_ms": prompt_s * 1e3,
            "prompt_per_second": evaluated / prompt_s if prompt_s > 0 else 0.0,
            "predicted_n": len(self.tokens),
            "predicted_ms": predicted_s * 1e3,
            "predicted_per_second": (len(self.tokens) - 1) / predicted_s if predicted_s > 0 else 0.0,
            **({"draft_n": job.drafted, "draft_n_accepted": job.accepted} if job.drafted else {}),
        }


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class Shape:
    """How one endpoint lays out its responses and stream chunks."""

    object_name = chunk_name = id_prefix = ""
    index = 0  # the choice's index: a prompt's place in a completions request's list

    def __init__(self, model_id: str, tokenizer: Tokenizer):
        self.model_id = model_id
        self.tokenizer = tokenizer
        self.id = f"{self.id_prefix}{uuid.uuid4().hex}"
        self.created = int(time.time())

    def envelope(self, name: str, choices: list[dict]) -> dict:
        return {
            "id": self.id,
            "object": name,
            "created": self.created,
            "model": self.model_id,
            "choices": choices,
        }

    def first_chunk(self) -> dict | None:
        return None

    def choice(self, text: str, tokens: list[TokenEvent] | None, finish: str | None, delta: bool) -> dict:
        """`tokens` is None when logprobs were not asked for."""
        raise NotImplementedError

    def whole_choice(self, text: str, tokens: list[TokenEvent] | None, finish: str | None) -> dict:
        return self.choice(text, tokens, finish, False)

    def delta_choices(self, text: str, tokens: list[TokenEvent] | None) -> list[dict]:
        """The chunks' choices for a piece of text (and its tokens when logprobs were asked for)."""
        return [self.choice(text, tokens, None, True)] if text or tokens else []

    def closing_choices(self, finish: str) -> list[dict]:
        """The last chunks' choices, the final one with the finish reason."""
        return [self.choice("", None, finish, True)]


class ChatShape(Shape):
    """With a `reply` parser, the text is split into reasoning, content and tool calls."""

    object_name, chunk_name, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(self, model_id: str, tokenizer: Tokenizer, reply: ReplyParser | None = None):
        super().__init__(model_id, tokenizer)
        self.reply = reply

    def first_chunk(self) -> dict:
        role = {"role": "assistant", "content": ""}
        return self.envelope(
            self.chunk_name, [{"index": self.index, "delta": role, "logprobs": None, "finish_reason": None}]
        )

    def _logprob(self, token: int, logprob: float | None) -> dict:
        text = self.tokenizer.token_text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def choice(self, text: str, tokens: list[TokenEvent] | None, finish: str | None, delta: bool) -> dict:
        logprobs = None
        if tokens is not None:
            logprobs = {
                "content": [
                    {
                        **self._logprob(e.token, e.logprob),
                        "top_logprobs": [self._logprob(*t) for t in e.top or []],
                    }
                    for e in tokens
                ]
            }
        message = ({"content": text} if text else {}) if delta else {"role": "assistant", "content": text}
        key = "delta" if delta else "message"
        return {"index": self.index, key: message, "logprobs": logprobs, "finish_reason": finish}

    def whole_choice(self, text: str, tokens: list[TokenEvent] | None, finish: str | None) -> dict:
        if self.reply is None:
            return super().whole_choice(text, tokens, finish)
        deltas, calls = self.reply.push(text), []
        if finish is not None:
            more, calls = self.reply.finish()
            deltas += more
        choice = self.choice("", tokens, reason(finish, calls), False)
        message = choice["message"]
        for part in deltas:
            for name, value in part.items():
                message[name] = message.get(name, "") + value
        message["content"] = message["content"] or (None if calls else "")
        if calls:
            message["tool_calls"] = calls
        return choice

    def delta_choices(self, text: str, tokens: list[TokenEvent] | None) -> list[dict]:
        if self.reply is None:
            return super().delta_choices(text, tokens)
        choices = [self._delta(part) for part in self.reply.push(text)]
        if tokens:
            with_logprobs = self.choice("", tokens, None, True)
            if choices:
                choices[0]["logprobs"] = with_logprobs["logprobs"]
            else:
                choices.append(with_logprobs)
        return choices

    def closing_choices(self, finish: str) -> list[dict]:
        if self.reply is None:
            return super().closing_choices(finish)
        deltas, calls = self.reply.finish()
        choices = [self._delta(part) for part in deltas]
        if calls:
            indexed = [{"index": index, **call} for index, call in enumerate(calls)]
            choices.append(self._delta({"tool_calls": indexed}))
        return [*choices, self.choice("", None, reason(finish, calls), True)]

    def _delta(self, fields: dict) -> dict:
        return {"index": 0, "delta": fields, "logprobs": None, "finish_reason": None}


def reason(finish: str | None, calls: list[dict]) -> str | None:
    """OpenAI's finish reason: a reply that ended with tool calls says so."""
    return "tool_calls" if calls and finish == "stop" else finish


class CompletionShape(Shape):
    object_name, chunk_name, id_prefix = "text_completion", "text_completion", "cmpl-"

    def choice(self, text: str, tokens: list[TokenEvent] | None, finish: str | None, delta: bool) -> dict:
        logprobs = None
        if tokens is not None:
            token_text = self.tokenizer.token_text
            logprobs = {
                "tokens": [token_text(e.token) for e in tokens],
                "token_logprobs": [e.logprob for e in tokens],
                "top_logprobs": [{token_text(t): v for t, v in e.top or []} for e in tokens],
            }
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}


async def collect(generation: Generation, shape: Shape) -> dict:
    texts: list[str] = []
    tokens: list[TokenEvent] = []
    finish = None
    async for piece in generation.pieces():
        texts.append(piece.text)
        tokens.extend(piece.tokens)
        finish = piece.finish
    wanted = tokens if generation.job.top_logprobs is not None else None
    response = shape.envelope(shape.object_name, [shape.whole_choice("".join(texts), wanted, finish)])
    return {**response, "usage": generation.usage(), "timings": generation.timings()}


async def stream_events(generation: Generation, shape: Shape, include_usage: bool) -> AsyncIterator[str]:
    first = shape.first_chunk()
    if first is not None:
        yield sse(first)
    logprobs = generation.job.top_logprobs is not None
    try:
        async for piece in generation.pieces():
            for choice in shape.delta_choices(piece.text, piece.tokens if logprobs else None):
                yield sse(shape.envelope(shape.chunk_name, [choice]))
            if piece.finish is not None:
                *before, final = shape.closing_choices(piece.finish)
                for choice in before:
                    yield sse(shape.envelope(shape.chunk_name, [choice]))
                yield sse({**shape.envelope(shape.chunk_name, [final]), "timings": generation.timings()})
        if include_usage:
            yield sse({**shape.envelope(shape.chunk_name, []), "usage": generation.usage()})
    except ApiError as err:  # headers are sent already: the error goes in the stream, as OpenAI does
        yield sse(error_body(err.message, err.kind, err.param, err.code))
    yield sse("[DONE]")

"""The OpenAI-compatible HTTP server: routes, OpenAI error bodies, API key, body limit and metrics.

The model loads in a background thread after the server starts listening, so /health answers 503
(with an OpenAI error body) until it is ready, and again once the generation worker has stopped or a
shutdown has begun. Generation runs on the scheduler's thread; handlers wait for tokens on asyncio
queues and cancel their job when the client goes away.

Slow clients: a connection must send each request's headers within `header_timeout` (checked by
`TimedH11Protocol`) and its body within `body_timeout` (checked by `Gate`, answered with a 408).
Shutdown (SIGTERM or Ctrl-C): new requests get 503 and running ones go on for `shutdown_timeout`;
then each still running ends with an error (an error event and [DONE] in a stream, a JSON 503
otherwise) and the process exits.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TypeVar

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from gufo import __version__
from gufo.engine.engine import Engine
from gufo.engine.speculative import make_speculators
from gufo.errors import BadInputError, GufoError
from gufo.server.metrics import Metrics
from gufo.server.scheduler import (
    FinishEvent,
    Job,
    QueueFullError,
    Scheduler,
    TokenEvent,
    WorkerDeadError,
)
from gufo.server.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest, error_body
from gufo.server.settings import ServerSettings
from gufo.server.text import TextStream
from gufo.tokenizer import Tokenizer

log = logging.getLogger(__name__)

RequestT = TypeVar("RequestT", bound=BaseModel)
SHUTDOWN_FLUSH_SECONDS = 5
ROUTES = ("/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions")


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


@dataclass
class Runtime:
    """What exists once the model has loaded."""

    engine: Engine
    scheduler: Scheduler


@dataclass
class ServerState:
    settings: ServerSettings
    metrics: Metrics = field(default_factory=Metrics)
    runtime: Runtime | None = None
    load_error: str | None = None
    shutting_down: bool = False
    started: int = field(default_factory=lambda: int(time.time()))

    def ready(self) -> Runtime:
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", "unavailable_error", code="shutting_down")
        if self.runtime is not None:
            if not self.runtime.scheduler.alive:
                message = f"the generation worker has stopped: {self.runtime.scheduler.failure}"
                raise ApiError(503, message, "unavailable_error", code="worker_stopped")
            return self.runtime
        if self.load_error is not None:
            raise ApiError(503, f"the model failed to load: {self.load_error}", "unavailable_error")
        raise ApiError(503, "the model is loading", "unavailable_error", code="model_loading")

    def begin_shutdown(self) -> None:
        """Refuse new requests now; after `shutdown_timeout` seconds end the running ones with a 503."""
        self.shutting_down = True
        runtime = self.runtime
        if runtime is not None:
            message = "the server shut down (--shutdown-timeout)"
            timer = threading.Timer(self.settings.shutdown_timeout, runtime.scheduler.abort, [message])
            timer.daemon = True
            timer.start()

    def gauges(self) -> dict[str, int]:
        if self.runtime is None:
            return {"gufo_requests_active": 0, "gufo_queue_depth": 0}
        return self.runtime.scheduler.gauges()


class Gate:
    """ASGI middleware in front of routing: API key (every route), body size limit, request counts.

    The body is read here, up to the limit, and replayed to the app; later `receive` calls pass
    through, so the app still sees the client's disconnect.
    """

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"

        async def counted_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.metrics.http_request(route, message["status"])
            await send(message)

        try:
            self._check_key(scope)
            body = await self._read_body(scope, receive)
        except ApiError as err:
            await err.response()(scope, receive, counted_send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, counted_send)

    def _check_key(self, scope: Scope) -> None:
        key = self.state.settings.api_key
        if key is None:
            return
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(
                401, "missing or wrong API key (send Authorization: Bearer KEY)", code="invalid_api_key"
            )

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.state.settings.max_request_bytes
        too_large = ApiError(413, f"request body over the limit of {limit} bytes", code="request_too_large")
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise too_large
            except ValueError:
                raise ApiError(400, "invalid Content-Length header") from None
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.state.settings.body_timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(
                    408, "the request body did not arrive in time (--body-timeout)", code="request_timeout"
                ) from None
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:  # a chunked body declares no length
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


@dataclass
class Piece:
    """Text released to the client and the tokens it came from; `finish` on the last one."""

    text: str
    tokens: list[TokenEvent]
    finish: str | None = None


class Generation:
    """The handler's side of one job: pieces of text as they are released, then usage and timings."""

    def __init__(self, state: ServerState, runtime: Runtime, job: Job, text: TextStream, echo: str = ""):
        """`echo`: text released before the first generated piece."""
        self.runtime, self.job, self.text, self.echo = runtime, job, text, echo
        timeout = state.settings.request_timeout
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
                    self.runtime.scheduler.cancel(self.job, "stop")  # a stop string: finished, not cancelled
                    yield Piece(delta, pending, "stop")
                    return
                if delta:
                    yield Piece(delta, pending)
                    pending = []
        finally:  # frees the slot after a stop string, a timeout or a disconnect; no-op once finished
            self.runtime.scheduler.cancel(self.job)

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


async def parse(request: Request, model: type[RequestT]) -> RequestT:
    """The JSON body as `model`, whatever the Content-Type says (curl -d sends a form type)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        first = err.errors()[0]
        if first["type"] == "json_invalid":
            raise ApiError(400, f"malformed JSON body: {first.get('ctx', {}).get('error', '')}") from None
        param = ".".join(str(part) for part in first["loc"] if not is_union_member(part)) or None
        reason = "unsupported parameter" if first["type"] == "extra_forbidden" else first["msg"]
        message = f"{param}: {reason}" if param else f"request body: {reason}"
        raise ApiError(400, message, param=param, code="invalid_value") from None


def is_union_member(loc_part: str | int) -> bool:
    """pydantic tags an error inside `str | list[int]` with the member's type ('str', 'list[int]'); the
    client named a field, not a type."""
    return isinstance(loc_part, str) and (loc_part in ("str", "int", "float", "bool") or "[" in loc_part)


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


async def cancel_on_disconnect(request: Request, task: asyncio.Task) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()


def create_app(
    settings: ServerSettings,
    load: Callable[[], Engine],
    on_load_error: Callable[[Exception], None] | None = None,
) -> FastAPI:
    """The ASGI app. `load` builds the engine on a background thread; `on_load_error` hears why it
    failed (the CLI stops the server then)."""
    state = ServerState(settings)

    def load_model() -> None:
        try:
            engine = load()
            speculative = settings.speculative
            speculators = (
                None if speculative is None else make_speculators(engine, speculative, settings.draft_model)
            )
            scheduler = Scheduler(
                engine, state.metrics, settings.max_pending, settings.prefill_chunk, speculators
            )
            scheduler.start()
            state.runtime = Runtime(engine, scheduler)
            log.info("model %s loaded", settings.model_id)
        except Exception as err:  # reported through /health and the CLI, not as a thread traceback
            # A traceback helps only when the failure is not one the user can act on.
            log.error("loading the model failed: %s", err, exc_info=not isinstance(err, GufoError))
            state.load_error = str(err)
            if on_load_error is not None:
                on_load_error(err)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader = threading.Thread(target=load_model, name="gufo-load", daemon=True)
        loader.start()
        yield
        await asyncio.to_thread(loader.join)
        if state.runtime is not None:
            state.runtime.scheduler.stop()

    app = FastAPI(title="gufo", version=__version__, lifespan=lifespan)
    app.state.gufo = state  # for `make_server`'s shutdown
    app.add_middleware(Gate, state=state)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, err: ApiError) -> JSONResponse:
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        else:
            message = str(err.detail)
        return ApiError(
            err.status_code, message, code="not_found" if err.status_code == 404 else None
        ).response()

    @app.exception_handler(Exception)
    async def internal_error(_: Request, err: Exception) -> JSONResponse:
        log.error("request failed", exc_info=err)  # the traceback stays in the server log
        return ApiError(500, "internal server error", "server_error").response()

    @app.get("/health")
    async def health() -> dict:
        state.ready()
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.gauges), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        entry = {"id": settings.model_id, "object": "model", "created": state.started, "owned_by": "gufo"}
        return {"object": "list", "data": [entry]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, ChatCompletionRequest)
        runtime = state.ready()
        messages = [m.as_template_input() for m in body.messages]
        tok = runtime.engine.tokenizer
        try:
            prompt_ids = tok.encode(tok.apply_chat_template(messages), add_special=True, parse_special=True)
        except BadInputError as err:
            raise ApiError(400, str(err), param="messages") from None
        return await respond(request, runtime, body, prompt_ids, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        runtime = state.ready()
        tok = runtime.engine.tokenizer
        if isinstance(body.prompt, str):
            prompt_ids = tok.encode(body.prompt, add_special=True, parse_special=True)
        else:
            prompt_ids = list(body.prompt)
            if not all(0 <= t < tok.vocab_size for t in prompt_ids):
                raise ApiError(400, f"prompt: token ids must be in [0, {tok.vocab_size})", param="prompt")
        if body.echo and body.logprobs is not None:  # OpenAI would score the prompt tokens too
            message = "echo: not supported together with logprobs (prompt tokens are not scored)"
            raise ApiError(400, message, param="echo", code="invalid_value")
        echo = ""
        if body.echo:
            echo = body.prompt if isinstance(body.prompt, str) else tok.decode(prompt_ids)
        return await respond(request, runtime, body, prompt_ids, chat=False, echo=echo)

    async def respond(
        request: Request,
        runtime: Runtime,
        body: GenerationRequest,
        prompt_ids: list[int],
        chat: bool,
        echo: str = "",
    ):
        """`echo`: text put before the generated text (completions' echo)."""
        if body.model != settings.model_id:
            raise ApiError(
                404,
                f"model '{body.model}' does not exist (this server has '{settings.model_id}')",
                param="model",
                code="model_not_found",
            )
        context = runtime.engine.context
        field_name = "messages" if chat else "prompt"
        if not prompt_ids:
            raise ApiError(400, f"{field_name}: empty prompt", param=field_name)
        if len(prompt_ids) >= context:
            raise ApiError(
                400,
                f"{field_name}: {len(prompt_ids)} tokens leave no room in the context of {context} tokens",
                param=field_name,
                code="context_length_exceeded",
            )
        limit_name, asked = body.token_limit()
        if asked is not None and asked > settings.max_tokens:
            message = f"{limit_name}: {asked} is over this server's limit of {settings.max_tokens}"
            raise ApiError(400, message, param=limit_name, code="invalid_value")
        vocab_size = runtime.engine.tokenizer.vocab_size
        if not all(0 <= t < vocab_size for t in body.biased_token_ids()):
            message = f"logit_bias: token ids must be in [0, {vocab_size})"
            raise ApiError(400, message, param="logit_bias", code="invalid_value")
        # The context bounds the output too; a reply cut by it ends with finish_reason "length".
        limit = min(asked or settings.max_tokens, context - len(prompt_ids))
        stop_ids = frozenset(body.stop_token_ids or ())
        job = Job(
            prompt_ids,
            limit,
            body.sampling_params(),
            asyncio.get_running_loop(),
            stop_ids=stop_ids,
            top_logprobs=body.logprob_count(),
            cache_prompt=body.cache_prompt,
        )
        try:
            runtime.scheduler.submit(job)
        except QueueFullError as err:
            retry = {"Retry-After": "1"}  # a slot frees as soon as any request finishes
            raise ApiError(429, str(err), "rate_limit_error", code="queue_full", headers=retry) from None
        except WorkerDeadError as err:
            raise ApiError(503, str(err), "unavailable_error", code="worker_stopped") from None
        text = TextStream(runtime.engine.tokenizer, body.stop_strings(), stop_ids)
        generation = Generation(state, runtime, job, text, echo)
        shape = (ChatShape if chat else CompletionShape)(settings.model_id, runtime.engine.tokenizer)
        if body.stream:
            return StreamingResponse(
                stream_events(generation, shape, body.include_usage),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        task = asyncio.ensure_future(collect(generation, shape))
        watcher = asyncio.ensure_future(cancel_on_disconnect(request, task))
        try:
            return await task
        except asyncio.CancelledError:
            if not watcher.done():
                raise
            return JSONResponse({}, status_code=499)  # the client left; nobody reads this
        finally:
            watcher.cancel()

    return app


class Shape:
    """How one endpoint lays out its responses and stream chunks."""

    object_name = chunk_name = id_prefix = ""

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


class ChatShape(Shape):
    object_name, chunk_name, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def first_chunk(self) -> dict:
        role = {"role": "assistant", "content": ""}
        return self.envelope(
            self.chunk_name, [{"index": 0, "delta": role, "logprobs": None, "finish_reason": None}]
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
        return {"index": 0, key: message, "logprobs": logprobs, "finish_reason": finish}


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
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


async def collect(generation: Generation, shape: Shape) -> dict:
    texts: list[str] = []
    tokens: list[TokenEvent] = []
    finish = None
    async for piece in generation.pieces():
        texts.append(piece.text)
        tokens.extend(piece.tokens)
        finish = piece.finish
    wanted = tokens if generation.job.top_logprobs is not None else None
    response = shape.envelope(shape.object_name, [shape.choice("".join(texts), wanted, finish, False)])
    return {**response, "usage": generation.usage(), "timings": generation.timings()}


async def stream_events(generation: Generation, shape: Shape, include_usage: bool) -> AsyncIterator[str]:
    first = shape.first_chunk()
    if first is not None:
        yield sse(first)
    logprobs = generation.job.top_logprobs is not None
    try:
        async for piece in generation.pieces():
            if piece.text or (piece.tokens and logprobs):
                tokens = piece.tokens if logprobs else None
                yield sse(shape.envelope(shape.chunk_name, [shape.choice(piece.text, tokens, None, True)]))
            if piece.finish is not None:
                last = shape.envelope(shape.chunk_name, [shape.choice("", None, piece.finish, True)])
                yield sse({**last, "timings": generation.timings()})
        if include_usage:
            yield sse({**shape.envelope(shape.chunk_name, []), "usage": generation.usage()})
    except ApiError as err:  # headers are sent already: the error goes in the stream, as OpenAI does
        yield sse(error_body(err.message, err.kind, err.param, err.code))
    yield sse("[DONE]")


def listen(host: str, port: int) -> socket.socket:
    """Bind before serving, so a busy port is one clear error and port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise GufoError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)  # connections made before uvicorn starts wait in the backlog
    return sock


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's headers: `header_timeout` seconds from
    the connection (or the previous response) on. uvicorn's keep-alive timer alone is reset by every
    byte, so a client dribbling its headers would hold the connection forever."""

    header_timeout: float = 10.0
    _header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_overdue)

    def _headers_overdue(self) -> None:
        no_request_begun = self.cycle is None or self.cycle.response_complete
        if no_request_begun and not self.transport.is_closing():
            self.transport.close()


class GufoServer(uvicorn.Server):
    """uvicorn's server whose first exit signal starts gufo's graceful shutdown (see the module doc)."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self.state.begin_shutdown()
        super().handle_exit(sig, frame)


def make_server(
    settings: ServerSettings,
    load: Callable[[], Engine],
    on_load_error: Callable[[Exception], None] | None = None,
    log_level: str | None = None,
) -> GufoServer:
    """The uvicorn server of `create_app`, with gufo's timeouts and shutdown."""
    app = create_app(settings, load, on_load_error)
    protocol = type("TimedH11Protocol", (TimedH11Protocol,), {"header_timeout": settings.header_timeout})
    config = uvicorn.Config(
        app,
        http=protocol,
        log_level=log_level,
        # Running requests end by themselves at the shutdown timeout; the margin lets their error
        # events and [DONE] reach the clients before uvicorn cancels what is left.
        timeout_graceful_shutdown=settings.shutdown_timeout + SHUTDOWN_FLUSH_SECONDS,
    )
    return GufoServer(config, app.state.gufo)


def serve(settings: ServerSettings, load: Callable[[], Engine], sock: socket.socket) -> None:
    """Serve until interrupted; a model that fails to load stops the server and raises here."""
    failures: list[Exception] = []

    def stop(err: Exception) -> None:
        failures.append(err)
        server.should_exit = True

    server = make_server(settings, load, stop)
    server.run(sockets=[sock])
    if failures:
        err = failures[0]
        raise err if isinstance(err, GufoError) else GufoError(f"loading the model failed: {err}")

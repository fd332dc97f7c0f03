"""The FastAPI app: the OpenAI-compatible endpoints, /health and /metrics, and OpenAI error answers.

A handler checks its request, submits a job to the scheduler and answers with the job's JSON
response or stream; it cancels the job when the client goes away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gufo import __version__
from gufo.engine.constraint import TokenConstraint
from gufo.engine.engine import Engine
from gufo.server import webui
from gufo.server.embeddings import (
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    detokenize,
    embeddings,
    tokenize,
)
from gufo.server.gate import Gate
from gufo.server.prompts import collect_all, stream_all
from gufo.server.reply import THINK_OPEN, ReplyParser
from gufo.server.responses import (
    ApiError,
    ChatShape,
    CompletionShape,
    Generation,
    Shape,
    collect,
    invalid_request,
    stream_events,
)
from gufo.server.responses_api import (
    ResponseDraft,
    ResponseStore,
    chat_request,
    collect_response,
    conversation,
    renamed,
    stream_response,
)
from gufo.server.responses_schema import ResponsesRequest
from gufo.server.scheduler import Job, QueueFullError, WorkerDeadError
from gufo.server.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from gufo.server.settings import ServerSettings
from gufo.server.state import Runtime, ServerState
from gufo.server.structured import (
    check_tools,
    client_grammar,
    constrained_field,
    constraint_for,
    render_prompt,
    thinks,
)
from gufo.server.text import TextStream

log = logging.getLogger(__name__)

RequestT = TypeVar("RequestT", bound=BaseModel)
ROUTES = (
    "/health",
    "/metrics",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/tokenize",
    "/detokenize",
)


async def parse(request: Request, model: type[RequestT]) -> RequestT:
    """The JSON body as `model`, whatever the Content-Type says (curl -d sends a form type)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as err:
        raise invalid_request(err) from None


async def cancel_on_disconnect(request: Request, task: asyncio.Task) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    task.cancel()


def create_app(
    settings: ServerSettings,
    load: Callable[[], Engine],
    on_loaded: Callable[[Exception | None], None] | None = None,
) -> FastAPI:
    """The ASGI app. `load` builds the engine on a background thread; `on_loaded` hears None once the
    server is ready, or why the load failed (the CLI says it is ready, or stops the server)."""
    state = ServerState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with state.running(load, on_loaded):
            yield

    app = FastAPI(title="gufo", version=__version__, lifespan=lifespan)
    app.state.gufo = state  # for `make_server`'s shutdown
    open_paths = webui.PAGE_PATHS if settings.webui else ()
    app.add_middleware(Gate, settings=settings, metrics=state.metrics, routes=ROUTES, open_paths=open_paths)
    if settings.cors_origins:  # outside the gate: a browser's preflight request carries no API key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
        )
    if settings.webui:
        webui.register(app)

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

    def model_entry() -> dict:
        return {"id": settings.model_id, "object": "model", "created": state.started, "owned_by": "gufo"}

    def check_model(name: str | None) -> None:
        """A request naming a model must name the served one (naming none is llama-server's default)."""
        if name is not None and name != settings.model_id:
            raise ApiError(
                404,
                f"model '{name}' does not exist (this server has '{settings.model_id}')",
                param="model",
                code="model_not_found",
            )

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_entry()]}

    @app.get("/v1/models/{model_name:path}")
    async def model(model_name: str) -> dict:
        check_model(model_name)
        return model_entry()

    @app.post("/v1/embeddings")
    async def embedding(request: Request) -> dict:
        body = await parse(request, EmbeddingRequest)
        check_model(body.model)
        runtime = state.ready()
        engine = runtime.engine
        return await embeddings(
            body, runtime.scheduler, engine.tokenizer, engine.context, settings.pooling, settings.model_id
        )

    @app.post("/tokenize")
    async def tokenize_text(request: Request) -> dict:
        body = await parse(request, TokenizeRequest)
        return tokenize(body, state.ready().engine.tokenizer)

    @app.post("/detokenize")
    async def detokenize_ids(request: Request) -> dict:
        body = await parse(request, DetokenizeRequest)
        return detokenize(body, state.ready().engine.tokenizer)

    async def prepare_chat(
        runtime: Runtime, body: ChatCompletionRequest
    ) -> tuple[list[int], TokenConstraint | None, ReplyParser | None]:
        """A checked chat request's prompt ids, its grammar, and how its reply's text splits into
        reasoning, content and tool calls (None: it is all content)."""
        check_tools(body)
        tok = runtime.engine.tokenizer
        prompt = render_prompt(body, tok, settings.chat_template)
        prompt_ids = tok.encode(prompt, add_special=True, parse_special=True)
        check_prompt(runtime, body, prompt_ids, "messages")
        constrained_field(body)  # a 400 when two fields constrain the reply
        constraint = await asyncio.to_thread(constraint_for, body, runtime.grammars)
        thinking = thinks(tok, settings.chat_template)
        tool_names = body.tool_names()
        if not thinking and tool_names is None:
            return prompt_ids, constraint, None
        # A grammar holds from the reply's first token, so a thought the prompt opened gets no text.
        in_thought = thinking and constraint is None and prompt.rstrip().endswith(THINK_OPEN)
        reply = ReplyParser(thinking, in_thought, tool_names, one_call=body.parallel_tool_calls is False)
        return prompt_ids, constraint, reply

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, ChatCompletionRequest)
        runtime = state.ready()
        prompt_ids, constraint, reply = await prepare_chat(runtime, body)
        generation = start(runtime, body, prompt_ids, "", constraint)
        shape = ChatShape(settings.model_id, runtime.engine.tokenizer, reply)
        return await respond(request, body, generation, shape)

    stored = ResponseStore()

    @app.post("/v1/responses")
    async def create_response(request: Request):
        body = await parse(request, ResponsesRequest)
        runtime = state.ready()
        check_model(body.model)
        messages = conversation(body, stored.conversation(body.previous_response_id))
        chat = chat_request(body, messages)
        try:
            prompt_ids, constraint, reply = await prepare_chat(runtime, chat)
        except ApiError as err:
            raise renamed(err) from None
        generation = start(runtime, chat, prompt_ids, "", constraint)
        tokenizer = runtime.engine.tokenizer
        draft = ResponseDraft(body, settings.model_id, messages, tokenizer, stored)
        if body.stream:
            return event_stream(stream_response(generation, draft, reply or ReplyParser()))
        return await until_disconnect(request, collect_response(generation, draft, reply or ReplyParser()))

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> dict:
        return stored.response(response_id)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        runtime = state.ready()
        tok = runtime.engine.tokenizer
        if body.echo and body.logprobs is not None:  # OpenAI would score the prompt tokens too
            message = "echo: not supported together with logprobs (prompt tokens are not scored)"
            raise ApiError(400, message, param="echo", code="invalid_value")
        several = body.several_prompts
        checked: list[tuple[list[int], str]] = []  # each prompt's ids and its echo
        for index, prompt in enumerate(body.prompts()):
            field_name = f"prompt.{index}" if several else "prompt"
            if isinstance(prompt, str):
                prompt_ids = tok.encode(prompt, add_special=True, parse_special=True)
            else:
                prompt_ids = list(prompt)
                if not all(0 <= t < tok.vocab_size for t in prompt_ids):
                    message = f"{field_name}: token ids must be in [0, {tok.vocab_size})"
                    raise ApiError(400, message, param=field_name)
            echo = ""
            if body.echo:
                echo = prompt if isinstance(prompt, str) else tok.decode(prompt_ids)
            check_prompt(runtime, body, prompt_ids, field_name)
            checked.append((prompt_ids, echo))
        grammar = None
        if body.grammar_field() is not None:
            grammar = await asyncio.to_thread(client_grammar, body, runtime.grammars)

        def constraint() -> TokenConstraint | None:  # each prompt's own matcher
            return None if grammar is None else TokenConstraint(grammar, runtime.grammars.vocab_size)

        if not several:
            generation = start(runtime, body, *checked[0], constraint())
            return await respond(request, body, generation, CompletionShape(settings.model_id, tok))
        generations: list[Generation] = []
        try:
            for prompt_ids, echo in checked:
                generations.append(start(runtime, body, prompt_ids, echo, constraint()))
        except ApiError:  # a full queue: the prompts already submitted go too
            for generation in generations:
                runtime.scheduler.cancel(generation.job)
            raise
        shape = CompletionShape(settings.model_id, tok)
        if body.stream:
            return event_stream(stream_all(generations, shape, body.include_usage))
        return await until_disconnect(request, collect_all(generations, shape))

    def check_prompt(
        runtime: Runtime, body: GenerationRequest, prompt_ids: list[int], field_name: str
    ) -> None:
        """A request's model and limits, and a prompt that leaves room in the context."""
        check_model(body.model)
        context = runtime.engine.context
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

    def start(
        runtime: Runtime,
        body: GenerationRequest,
        prompt_ids: list[int],
        echo: str,
        constraint: TokenConstraint | None = None,
    ) -> Generation:
        """Submit a checked prompt's job; `echo`: text put before the generated text (completions');
        `constraint`: the grammar its tokens follow."""
        _, asked = body.token_limit()
        # The context bounds the output too; a reply cut by it ends with finish_reason "length".
        limit = min(asked or settings.max_tokens, runtime.engine.context - len(prompt_ids))
        if constraint is not None:
            constraint.fit(limit)
        stop_ids = frozenset(body.stop_token_ids or ())
        job = Job(
            prompt_ids,
            limit,
            body.sampling_params(),
            asyncio.get_running_loop(),
            stop_ids=stop_ids,
            top_logprobs=body.logprob_count(),
            cache_prompt=body.cache_prompt,
            constraint=constraint,
        )
        try:
            runtime.scheduler.submit(job)
        except QueueFullError as err:
            retry = {"Retry-After": "1"}  # a slot frees as soon as any request finishes
            raise ApiError(429, str(err), "rate_limit_error", code="queue_full", headers=retry) from None
        except WorkerDeadError as err:
            raise ApiError(503, str(err), "unavailable_error", code="worker_stopped") from None
        text = TextStream(runtime.engine.tokenizer, body.stop_strings(), stop_ids)
        return Generation(runtime.scheduler, job, text, settings.request_timeout, echo)

    async def respond(request: Request, body: GenerationRequest, generation: Generation, shape: Shape):
        """A started generation's JSON response, or its stream."""
        if body.stream:
            return event_stream(stream_events(generation, shape, body.include_usage))
        return await until_disconnect(request, collect(generation, shape))

    def event_stream(events: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(
            events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def until_disconnect(request: Request, answer: Awaitable[dict]):
        """`answer`'s JSON, or nothing once the client has gone away (its jobs are cancelled)."""
        task = asyncio.ensure_future(answer)
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

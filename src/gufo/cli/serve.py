"""`gufo serve`: an OpenAI-compatible HTTP server (the work is in gufo.server)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gufo.cli.chat import named_template
from gufo.cli.commands import summary
from gufo.cli.common import (
    add_engine_flags,
    add_speculative_flags,
    add_tensor_parallel_flag,
    byte_size,
    make_engine,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
    speculative_params,
)
from gufo.gguf.aliases import ALIASES, DEFAULT_MODEL
from gufo.options import POOLINGS
from gufo.server.settings import DEFAULT_PREFILL_BATCH, DEFAULT_PREFILL_CHUNK, ServerSettings
from gufo.tokenizer.chat import BUILTIN_TEMPLATES

DEFAULTS = ServerSettings(model_id="")

EPILOG = """\
Endpoints: POST /v1/chat/completions, POST /v1/completions (a prompt, or a list of them: one choice
each), POST /v1/embeddings (unit-length vectors; encoding_format float or base64), GET /v1/models,
GET /v1/models/ID, POST /tokenize and POST /detokenize (llama-server's), the chat page at / (--webui),
GET /health (503 while the model loads), GET /metrics (Prometheus text; with --speculative,
gufo_draft_tokens_total and gufo_draft_tokens_accepted_total count drafts; gufo_worker_up is 0 once
generation has stopped, and /health is 503 then). Errors use OpenAI's error object; a parameter the
server does not implement is a 400 naming it, never ignored (n, best_of and suffix only at their
no-op values). Chat completions take tools and tool_choice (calls parsed from hermes-style <tool_call>
JSON; "required" and a named function are enforced by constrained decoding), response_format
json_object and json_schema (a token mask; a json_object reply closes its strings, arrays and objects
before max_tokens runs out, finish_reason "length" then), and split a thinking template's <think> text into
reasoning_content. Request extensions: top_k, min_p, repeat_penalty (llama.cpp sampling),
stop_token_ids, cache_prompt=false (no prefix reuse), chat_template_kwargs (variables for the chat
template, e.g. enable_thinking); max_completion_tokens is max_tokens' newer name in chat completions.
Greedy output (and seeded sampled output) does not depend on prefix reuse, streaming or concurrency;
where prefill is not chunk-invariant (neither the CPU's fused layer nor the GPU's --prefill-products
tiles), only whole --prefill-chunk chunks of prompt tokens are reused for that. A model with recurrent
state reuses a prefix where a session saved its state (--state-checkpoints), or the whole sequence a
session holds.
Responses carry usage and timings (cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms; with
speculation also draft_n and draft_n_accepted).
With --speculative each request drafts and verifies in its own slot (a draft model gets as many slots
as --sessions): greedy output equals plain serving, sampled output keeps the model's distribution."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help=summary("serve"),
        description="Serve the model over an OpenAI-compatible HTTP API. Requests share N preallocated KV "
        "slots; active ones decode together, new prompts are prefilled in chunks between decode steps, and "
        "a request whose prompt shares a prefix with what a free slot holds reuses that KV.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_flags(
        parser,
        batch_help="prompt tokens per forward pass during prefill (default: --prefill-chunk, so that on a "
        "GPU a full chunk replays captured graphs unpadded; shorter chunks replay graphs padded to the next "
        "power of two from 16, all captured while the model loads)",
    )
    add_tensor_parallel_flag(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=port_number, default=8080, help="TCP port (default 8080; 0 picks a free one)"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="uvicorn's own log on stderr: its start-up lines and one line per request (default: warnings)",
    )
    parser.add_argument(
        "--sessions", type=positive_int, default=1, help="KV slots, i.e. requests served at once (default 1)"
    )
    parser.add_argument(
        "--kv-memory",
        type=byte_size,
        default=None,
        metavar="SIZE",
        help="memory of the KV cache, e.g. 8G (K, M, G: 1000, 1000^2, 1000^3 bytes): pages of 64 positions "
        "that the sessions take as their sequences grow and give back as they end, so --sessions x "
        "--ctx-size may exceed it; a request waits until the pages its prompt and max_tokens need are free, "
        "and the cached prefixes of finished requests are dropped (least recently used first) to make "
        "room. At least one --ctx-size sequence (default: every session's whole context, on a GPU at most "
        "80%% of the memory free after the model loads)",
    )
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULTS.max_tokens,
        help=f"tokens generated per request when it sets no limit, and the most it may ask for "
        f"(default {DEFAULTS.max_tokens})",
    )
    parser.add_argument(
        "--max-pending",
        type=non_negative_int,
        default=DEFAULTS.max_pending,
        help=f"requests that may wait for a slot; beyond that, 429 (default {DEFAULTS.max_pending})",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=DEFAULTS.max_request_bytes,
        help=f"largest request body accepted; larger ones get 413 (default {DEFAULTS.max_request_bytes})",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="seconds a request may take, queueing included, before it is cancelled (default: no limit)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=positive_float,
        default=DEFAULTS.shutdown_timeout,
        metavar="S",
        help="on SIGTERM or Ctrl-C, seconds running requests may go on (new ones get 503); then each "
        f"ends with an error event and [DONE], or a JSON 503 (default {DEFAULTS.shutdown_timeout:g})",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_float,
        default=DEFAULTS.header_timeout,
        metavar="S",
        help="seconds a connection has to send a request's headers before it is closed "
        f"(default {DEFAULTS.header_timeout:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=positive_float,
        default=DEFAULTS.body_timeout,
        metavar="S",
        help=f"seconds a request has to send its body; then 408 (default {DEFAULTS.body_timeout:g})",
    )
    parser.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route (default: none)"
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="model id clients must name (default: the -m alias, or the file name without .gguf)",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULT_PREFILL_CHUNK,
        help=f"prompts are prefilled in chunks that end at multiples of this many tokens, whatever else "
        f"runs, so a prompt's numbers never depend on the load (default {DEFAULT_PREFILL_CHUNK}; also -b's "
        "default)",
    )
    parser.add_argument(
        "--prefill-batch",
        type=positive_int,
        default=None,
        metavar="N",
        help="prompt tokens prefilled per scheduler step, between decode steps, over the waiting prompts in "
        "turn (a step's first chunk always runs); on a GPU, where every layer is dense attention, with "
        "the fixed-tile prefill products (--prefill-products tiles; auto, the default here, picks them for "
        "such models), their chunks share one forward pass (up to 16 a pass), so that many arriving "
        f"prompts cost fewer passes; more per step delays the running streams' next token longer (default: "
        f"{DEFAULT_PREFILL_BATCH} where chunks share passes, else --prefill-chunk)",
    )
    parser.add_argument(
        "--state-checkpoints",
        type=non_negative_int,
        default=DEFAULTS.state_checkpoints,
        metavar="N",
        help="models with recurrent state (qwen35, qwen35moe, qwen3next): saved states the sessions keep "
        "in all, taken where a prefill chunk ends at a multiple of --prefill-chunk (and at a prompt's end "
        "where prefill is batch-invariant), so that a prompt sharing those tokens resumes there instead of "
        "prefilling from its start; the least recently saved or resumed goes first; each costs one "
        "session's recurrent state in memory (0: off; default: as many as --sessions)",
    )
    parser.add_argument(
        "--pooling",
        choices=POOLINGS,
        default=DEFAULTS.pooling,
        help="how /v1/embeddings pools the output norm's values over the input's tokens: their mean, or "
        f"the last token's (default {DEFAULTS.pooling})",
    )
    parser.add_argument(
        "--cors-origins",
        default=None,
        metavar="ORIGINS",
        help="comma-separated browser origins (e.g. http://localhost:3000, or *) allowed to call the API "
        "from their pages (CORS; default: none)",
    )
    parser.add_argument(
        "--webui",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the built-in chat page at / (default: on when --host is 127.0.0.1 or localhost; "
        "--no-webui turns it off)",
    )
    parser.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        default=None,
        help=f"render chat requests with a built-in template ({', '.join(BUILTIN_TEMPLATES)}) or a jinja "
        "file instead of the GGUF's own (default: the GGUF's, else ChatML or Gemma's format)",
    )
    add_speculative_flags(parser)
    # prompts share prefill passes only on products that keep each row's numbers (Engine.packs_prefill)
    parser.set_defaults(func=run, prefill_products="auto")


def model_id(args: argparse.Namespace, path: Path) -> str:
    if args.served_model_name:
        return args.served_model_name
    name = args.model or DEFAULT_MODEL
    return name if name in ALIASES else path.stem


def batch_size(args: argparse.Namespace) -> int:
    """-b, else --prefill-chunk: a scheduler step's full chunk is then one forward pass, on a GPU one
    replay of unpadded graphs."""
    return args.prefill_chunk if args.batch_size is None else args.batch_size


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def cors_origins(value: str | None) -> tuple[str, ...]:
    return tuple(origin.strip() for origin in (value or "").split(",") if origin.strip())


def webui_on(host: str, flag: bool | None) -> bool:
    """--webui / --no-webui, else on for a server only this machine reaches."""
    return host in LOCAL_HOSTS if flag is None else flag


def run(args: argparse.Namespace) -> int:
    from gufo.engine.loader import open_checked
    from gufo.engine.speculative import check_proposer
    from gufo.parallel.mirror import follow
    from gufo.parallel.model import preflight
    from gufo.parallel.process_group import launched_rank

    args.batch_size = batch_size(args)
    # a bad -m, or a truncated or unsupported file, is one line and exit 2 before anything listens
    path, model_file = open_checked(args.model)
    # so are bad speculative flags, a mismatched draft model and a file without an MTP block
    speculative = speculative_params(args)
    if speculative is not None:
        check_proposer(model_file, speculative, args.draft_model)
    settings = ServerSettings(
        model_id=model_id(args, path),
        max_tokens=args.max_tokens,
        max_pending=args.max_pending,
        max_request_bytes=args.max_request_bytes,
        request_timeout=args.request_timeout,
        shutdown_timeout=args.shutdown_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        api_key=args.api_key,
        prefill_chunk=args.prefill_chunk,
        prefill_batch=args.prefill_batch,
        state_checkpoints=args.state_checkpoints,
        speculative=speculative,
        draft_model=args.draft_model,
        pooling=args.pooling,
        cors_origins=cors_origins(args.cors_origins),
        webui=webui_on(args.host, args.webui),
        chat_template=None if args.chat_template is None else named_template(args.chat_template),
    )
    if args.tensor_parallel > 1:
        preflight(model_file, args.tensor_parallel)  # refused before anything listens
        if launched_rank() != 0:  # only rank 0 listens; the others run its steps
            return follow(make_engine(args, n_slots=args.sessions, kv_memory=args.kv_memory))
    from gufo.server.run import listen, serve  # the ASGI stack loads only when serving

    sock = listen(args.host, args.port)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    print(f"gufo: serving {settings.model_id} on {url} (loading the model)", file=sys.stderr, flush=True)

    def ready() -> None:
        print(f"gufo: ready: {settings.model_id} answers on {url}/v1", file=sys.stderr, flush=True)

    load = lambda: make_engine(args, n_slots=args.sessions, kv_memory=args.kv_memory)  # noqa: E731
    serve(settings, load, sock, ready, log_level="info" if args.verbose else "warning")
    return 0

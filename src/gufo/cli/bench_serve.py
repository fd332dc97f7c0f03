"""`gufo bench-serve`: client-side latency and throughput of an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gufo.cli.commands import summary
from gufo.cli.common import positive_float, positive_int
from gufo.errors import BadInputError

if TYPE_CHECKING:
    from gufo.tools.bench.serving import TokenCounter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-serve",
        help=summary("bench-serve"),
        description="Start C streaming greedy /v1/completions (with --endpoint chat, /v1/chat/completions) "
        "requests together (a random prefix each and cache_prompt=false, so nothing reuses a cached "
        "prefix) and report per C: TTFT and inter-token latency p50/p95/p99 (per token with --tokenizer, "
        "which counts the tokens each streamed chunk carries; per chunk without it), prefill tok/s (prompt "
        "tokens / TTFT), decode tok/s per request, aggregate tok/s over the round, and whether greedy "
        "outputs at C>1 equal those at C=1 (SHA-256 of the text). The JSON holds no prompt, generated text "
        "or host name.",
    )
    parser.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--concurrency", default="1,2,4", help="concurrent requests per round, a list (default 1,2,4)"
    )
    parser.add_argument(
        "--max-tokens", type=positive_int, default=128, help="tokens generated per request (default 128)"
    )
    parser.add_argument(
        "-r", "--repetitions", type=positive_int, default=3, help="timed rounds per concurrency (default 3)"
    )
    parser.add_argument(
        "--prompt-words", type=positive_int, default=200, help="filler words in each prompt (default 200)"
    )
    parser.add_argument(
        "--model", default=None, help="model id to request (default: the first in /v1/models)"
    )
    parser.add_argument(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="/v1/completions with the prompt, or /v1/chat/completions with it as one user message "
        "(default completions)",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="MODEL",
        help="GGUF path or alias whose tokenizer counts the tokens of each streamed chunk (ITL per token) "
        "and of streams that send no usage (default: none; ITL per chunk)",
    )
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds to wait on one request (default 600)"
    )
    parser.add_argument("-o", "--output", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--progress", action="store_true", help="print progress lines on stderr")
    parser.set_defaults(func=run)


def token_counter(model: str) -> TokenCounter:
    from gufo.gguf.aliases import resolve_model
    from gufo.gguf.model_file import open_model_file
    from gufo.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(open_model_file(resolve_model(model)).metadata)
    return lambda text: len(tokenizer.encode(text, add_special=False, parse_special=False))


def run(args: argparse.Namespace) -> int:
    from gufo.tools.bench.lists import parse_positive_list
    from gufo.tools.bench.serving import Client, markdown, run_serving_bench

    concurrency = parse_positive_list(args.concurrency, "--concurrency")
    if args.output is not None and not args.output.parent.is_dir():
        raise BadInputError(f"--output {args.output}: no such directory {args.output.parent}")
    client = Client(
        args.base_url,
        api_key=args.api_key,
        timeout=args.timeout,
        model=args.model or "",
        endpoint=args.endpoint,
        token_counter=None if args.tokenizer is None else token_counter(args.tokenizer),
    )
    progress = (lambda line: print(f"bench-serve: {line}", file=sys.stderr)) if args.progress else None
    report = run_serving_bench(
        client, concurrency, args.max_tokens, args.repetitions, args.prompt_words, progress
    )
    print(markdown(report))
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    parity = [r["greedy_matches_c1"] for r in report["results"]]
    return 1 if False in parity else 0

"""`gufo bench-serve`: client-side latency and throughput of an OpenAI-compatible server."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gufo.cli.commands import summary
from gufo.cli.common import non_negative_int, positive_float, positive_int
from gufo.errors import BadInputError

if TYPE_CHECKING:
    from gufo.tools.bench.serving import LoadPoint, TokenCounter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench-serve",
        help=summary("bench-serve"),
        description="Send streaming greedy /v1/completions (with --endpoint chat, /v1/chat/completions) "
        "requests at each load point: C requests together per repetition (--concurrency), or --requests "
        "requests at Poisson arrivals of R per second (--request-rate, seeded; open loop). Each prompt "
        "starts with a random prefix and asks for cache_prompt=false, so nothing reuses a cached prefix "
        "(with --shared-prefix-words, every prompt starts with the same words and asks for reuse "
        "instead). Reports per load point: TTFT, inter-token latency and end-to-end latency "
        "p50/p95/p99 (ITL per token with --tokenizer, which counts the tokens each streamed chunk "
        "carries; per chunk without it), prefill tok/s (prompt tokens / TTFT), decode tok/s per request, "
        "aggregate tok/s and requests/s over the repetition, the cached prompt tokens, and whether "
        "greedy outputs under load equal those sent one at a time (SHA-256 of the text). With "
        "--response-format or --json-schema every chat request is constrained, to compare with a run "
        "without. The JSON holds no prompt, generated text or host name.",
    )
    parser.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8080")
    parser.add_argument(
        "--concurrency",
        default=None,
        help="concurrent requests per repetition, a list (default 1,2,4 unless --request-rate is given)",
    )
    parser.add_argument(
        "--request-rate",
        default=None,
        metavar="R",
        help="request rates (per second) to send at, a list such as 0.5,1,2: per repetition --requests "
        "requests, the gaps between them drawn from an exponential distribution (Poisson arrivals); "
        "measured after the --concurrency points when both are given (default: none)",
    )
    parser.add_argument(
        "--requests",
        type=positive_int,
        default=16,
        help="requests per repetition at each --request-rate (default 16)",
    )
    parser.add_argument(
        "--max-tokens",
        default="128",
        metavar="N|A:B",
        help="tokens generated per request, or a range A:B each request draws from uniformly (default 128)",
    )
    parser.add_argument(
        "-r",
        "--repetitions",
        type=positive_int,
        default=3,
        help="timed repetitions per load point (default 3)",
    )
    parser.add_argument(
        "--parity",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="greedy parity: check at most N requests of each load point against the same request sent "
        "alone (the point's other requests are other prompts, so the checked ones still run among as "
        "many; the reference requests go one at a time, which at C=256 takes minutes); 0 checks none "
        "(default: every request of the point)",
    )
    parser.add_argument(
        "--prompt-words",
        default="200",
        metavar="N|A:B",
        help="filler words in each prompt, or a range A:B each request draws from uniformly (default 200)",
    )
    parser.add_argument(
        "--shared-prefix-words",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="start every prompt with the same N words and let the server reuse cached prefixes "
        "(cache_prompt=true), to measure its prefix cache (default 0: no shared prefix, no reuse)",
    )
    parser.add_argument(
        "--no-prefix-reuse",
        action="store_true",
        help="with --shared-prefix-words: send cache_prompt=false all the same, so the server prefills "
        "every prompt whole: the baseline the prefix cache's gain is measured against",
    )
    parser.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="seed of the arrival times and of the lengths drawn from ranges (default 0)",
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
    constraint = parser.add_mutually_exclusive_group()
    constraint.add_argument(
        "--response-format",
        choices=("json_object",),
        default=None,
        help='send response_format {"type": "json_object"} with every request, to measure what '
        "constrained decoding costs against a run without it (needs --endpoint chat; default: none)",
    )
    constraint.add_argument(
        "--json-schema",
        type=Path,
        default=None,
        metavar="FILE",
        help="send response_format json_schema (strict) with the JSON schema in FILE with every request; "
        "the outputs end where the schema's JSON does, so pick one that allows max_tokens of output, such "
        "as an object with one long string (needs --endpoint chat; default: none)",
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
    parser.add_argument(
        "--sweep",
        type=Path,
        default=None,
        metavar="CSV",
        help="also write one table of throughput against latency here as CSV: per load point requests/s, "
        "aggregate tok/s, TTFT, ITL and end-to-end latency p50 and p99, cached fraction, greedy parity",
    )
    parser.add_argument("--progress", action="store_true", help="print progress lines on stderr")
    parser.set_defaults(func=run)


def token_counter(model: str) -> TokenCounter:
    from gufo.gguf.aliases import resolve_model
    from gufo.gguf.model_file import open_model_file
    from gufo.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(open_model_file(resolve_model(model)).metadata)
    return lambda text: len(tokenizer.encode(text, add_special=False, parse_special=False))


def response_format(args: argparse.Namespace) -> dict | None:
    """The response_format the requests carry, from --response-format or --json-schema."""
    if args.response_format is None and args.json_schema is None:
        return None
    flag = "--response-format" if args.json_schema is None else "--json-schema"
    if args.endpoint != "chat":
        raise BadInputError(f"{flag} needs --endpoint chat (response_format is a chat completions field)")
    if args.json_schema is None:
        return {"type": args.response_format}
    try:
        schema = json.loads(args.json_schema.read_text())
    except OSError as err:
        raise BadInputError(f"--json-schema {args.json_schema}: {err.strerror}") from None
    except ValueError as err:
        raise BadInputError(f"--json-schema {args.json_schema}: not JSON: {err}") from None
    if not isinstance(schema, dict):
        raise BadInputError(f"--json-schema {args.json_schema}: a JSON schema is an object")
    return {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema, "strict": True}}


def load_points(args: argparse.Namespace) -> list[LoadPoint]:
    """The --concurrency points (1,2,4 when neither list is given), then the --request-rate points."""
    from gufo.tools.bench.lists import parse_positive_floats, parse_positive_list
    from gufo.tools.bench.serving import LoadPoint

    concurrency = args.concurrency
    if concurrency is None and args.request_rate is None:
        concurrency = "1,2,4"
    points = []
    if concurrency is not None:
        points += [LoadPoint(concurrency=c) for c in parse_positive_list(concurrency, "--concurrency")]
    if args.request_rate is not None:
        rates = parse_positive_floats(args.request_rate, "--request-rate")
        points += [LoadPoint(rate=rate, requests=args.requests) for rate in rates]
    return points


def run(args: argparse.Namespace) -> int:
    from gufo.tools.bench.lists import parse_span
    from gufo.tools.bench.serving import Client, Workload, markdown, run_serving_bench, write_sweep

    if args.no_prefix_reuse and not args.shared_prefix_words:
        raise BadInputError("--no-prefix-reuse: needs --shared-prefix-words (without it nothing is reused)")
    points = load_points(args)
    constraint = response_format(args)
    workload = Workload(
        parse_span(args.prompt_words, "--prompt-words"),
        parse_span(args.max_tokens, "--max-tokens"),
        args.shared_prefix_words,
        args.seed,
        reuse_prefix=not args.no_prefix_reuse,
    )
    for path, flag in ((args.output, "--output"), (args.sweep, "--sweep")):
        if path is not None and not path.parent.is_dir():
            raise BadInputError(f"{flag} {path}: no such directory {path.parent}")
    client = Client(
        args.base_url,
        api_key=args.api_key,
        timeout=args.timeout,
        model=args.model or "",
        endpoint=args.endpoint,
        response_format=constraint,
        token_counter=None if args.tokenizer is None else token_counter(args.tokenizer),
    )
    progress = (lambda line: print(f"bench-serve: {line}", file=sys.stderr)) if args.progress else None
    report = run_serving_bench(client, points, workload, args.repetitions, progress, args.parity)
    print(markdown(report))
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
    if args.sweep is not None:
        write_sweep(report, args.sweep)
    parity = [r["greedy_matches_c1"] for r in report["results"]]
    return 1 if False in parity else 0

"""`gufo run`: generate a continuation of a prompt, streamed to stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gufo.cli.commands import summary
from gufo.cli.common import (
    add_engine_flags,
    add_sampling_flags,
    add_speculative_flags,
    add_tensor_parallel_flag,
    make_engine,
    non_negative_int,
    sampling_params,
    speculative_params,
)
from gufo.errors import BadInputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help=summary("run"),
        description="Generate a continuation of PROMPT and stream it to stdout. A timing line (prompt and "
        "generation tokens per second) goes to stderr.",
    )
    add_engine_flags(parser)
    add_tensor_parallel_flag(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-p", "--prompt", help="prompt text (BOS is added when the model asks)")
    source.add_argument("-f", "--file", type=Path, help="read the prompt text from this file")
    parser.add_argument(
        "-n",
        "--n-predict",
        type=non_negative_int,
        default=128,
        help="number of tokens to generate (default 128)",
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens"
    )
    parser.add_argument(
        "--no-special", action="store_true", help="treat special-token text in the prompt as plain text"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print [TokenTrace]: count=N sha256=H of the generated ids, the kernel route of each "
        "op and, with --speculative, [Speculative]: drafted=D accepted=A acceptance=A/D steps=S on stderr",
    )
    add_sampling_flags(parser)
    add_speculative_flags(parser)
    parser.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    try:
        return args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"--file {args.file}: cannot read: {err}") from None


def run(args: argparse.Namespace) -> int:
    from gufo.engine.speculative import make_speculator
    from gufo.engine.trace import token_trace_line
    from gufo.parallel.engine import follows
    from gufo.parallel.mirror import follow

    params = sampling_params(args)
    speculative = speculative_params(args)
    engine = make_engine(args)
    if follows(engine):  # tensor-parallel rank > 0: run rank 0's steps, print nothing
        return follow(engine)
    speculator = make_speculator(engine, speculative, args.draft_model) if speculative else None
    tok = engine.tokenizer
    prompt_ids = tok.encode(read_prompt(args), add_special=True, parse_special=not args.no_special)
    engine.check_fits(len(prompt_ids) + max(args.n_predict - 1, 0))
    stream = tok.stream_decoder()

    def emit(token: int) -> None:
        if not args.ignore_eos and token in tok.eog_ids:
            return
        sys.stdout.write(stream.push(token))
        sys.stdout.flush()

    result = (speculator or engine).generate(
        prompt_ids, args.n_predict, params, stop_at_eog=not args.ignore_eos, on_token=emit
    )
    sys.stdout.write(stream.flush() + "\n")
    sys.stdout.flush()
    print(
        f"prompt: {len(prompt_ids)} tokens, {result.prompt_seconds * 1e3:.1f} ms, "
        f"{result.prompt_tps:.2f} tok/s | "
        f"generation: {len(result.generated_ids)} tokens, {result.generation_seconds * 1e3:.1f} ms, "
        f"{result.generation_tps:.2f} tok/s",
        file=sys.stderr,
    )
    if args.verbose:
        routes = " ".join(f"{op}={route}" for op, route in sorted(engine.model.routes().items()))
        print(f"[Routes]: {routes}", file=sys.stderr)
        print(token_trace_line(result.generated_ids), file=sys.stderr)
        if speculator is not None:
            print(speculator.stats.line(), file=sys.stderr)
    return 0

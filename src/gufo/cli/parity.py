"""`gufo parity`: greedy speculative decoding must reproduce plain decoding on a prompt corpus."""

from __future__ import annotations

import argparse
from pathlib import Path

from gufo.cli.commands import summary
from gufo.cli.common import (
    add_engine_flags,
    add_speculative_flags,
    make_engine,
    positive_int,
    speculative_params,
)
from gufo.errors import CheckFailedError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "parity",
        help=summary("parity"),
        description="Run every prompt of a corpus greedily through plain autoregressive decoding and through "
        "a speculative mode; print one [Parity] line per prompt (token trace hashes, tok/s, acceptance) "
        "and a [Parity Summary] line. Exit 1 when any prompt's generated ids differ.",
    )
    add_engine_flags(parser)
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        help='JSONL prompts, one {"id", "prompt", "repetitive"} object a line '
        "(default: the corpus shipped with gufo, half repetitive)",
    )
    parser.add_argument(
        "-n", "--n-predict", type=positive_int, default=64, help="tokens generated per prompt (default 64)"
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens"
    )
    add_speculative_flags(parser, required=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gufo.engine.speculative import make_speculator
    from gufo.tools.quality.parity import ParitySummary, load_corpus, run_parity

    prompts = load_corpus(args.corpus)
    speculative = speculative_params(args)  # never None: --speculative is required here
    engine = make_engine(args)
    speculator = make_speculator(engine, speculative, args.draft_model)
    results = []
    for result in run_parity(engine, speculator, prompts, args.n_predict, not args.ignore_eos):
        print(result.line(), flush=True)
        results.append(result)
    summary = ParitySummary(results)
    print(summary.line(), flush=True)
    if summary.mismatches:
        raise CheckFailedError(f"{summary.mismatches} of {len(results)} prompts differ from plain decoding")
    return 0

"""`gufo quality`: record reference next-token distributions, or compare a run against them (gate)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from gufo import __version__
from gufo.cli.commands import summary
from gufo.cli.common import (
    NOISE_ENV,
    add_engine_flags,
    make_engine,
    non_negative_int,
    parse_id_list,
    parse_noise,
    positive_int,
)
from gufo.errors import BadInputError, CheckFailedError

if TYPE_CHECKING:
    import numpy as np

EPILOG = f"""\
Typical use: record on a trusted route, then gate a changed kernel, build, device or toolchain:
  gufo quality -m MODEL -f text.txt --save-logits ref.npz
  gufo quality -m MODEL --device cuda --reference ref.npz --max-kl 0.01 --min-top1 99
The reference file carries its token sequence and chunking, so the candidate needs no corpus.
Debugging the gate: {NOISE_ENV}=LAYER:STD adds noise to one layer on batched passes (a perturbed route).
Exit codes: 0 success, 1 a gate failed or a candidate row is not finite, 2 bad input."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "quality",
        help=summary("quality"),
        description="Teacher-forced comparison in the style of llama-perplexity --kl-divergence: record the "
        "next-token distributions of a reference run over a text or token corpus (--save-logits), or run "
        "a candidate over the reference's tokens and report mean/median/p99/max KL, top-1 agreement, RMS "
        "of next-token probability differences, both perplexities and non-finite counts (--reference).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_engine_flags(parser)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save-logits", type=Path, metavar="FILE", help="record a reference run to FILE")
    mode.add_argument("--reference", type=Path, metavar="FILE", help="compare this run with FILE")
    corpus = parser.add_mutually_exclusive_group()
    corpus.add_argument("-f", "--file", type=Path, help="--save-logits: text corpus (tokenized, BOS added)")
    corpus.add_argument(
        "--tokens", type=Path, metavar="FILE", help="--save-logits: token ids separated by commas or spaces"
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        default=512,
        help="--save-logits: tokens per window, each evaluated from position 0 (default 512)",
    )
    parser.add_argument(
        "--top-k",
        type=non_negative_int,
        default=256,
        help="--save-logits: logits kept per position besides the log-sum-exp; 0 = the full vocabulary "
        "(default 256)",
    )
    parser.add_argument(
        "--max-kl", type=float, default=None, help="gate: exit 1 when the mean KL (nats) exceeds this"
    )
    parser.add_argument(
        "--min-top1", type=float, default=None, help="gate: exit 1 when top-1 agreement (%%) is below this"
    )
    parser.add_argument("--json", action="store_true", help="also print the statistics as one JSON line")
    parser.set_defaults(func=run)


def read_tokens(args: argparse.Namespace, engine) -> np.ndarray:
    import numpy as np

    source = args.file or args.tokens
    if source is None:
        raise BadInputError("--save-logits needs a corpus: -f TEXT or --tokens FILE")
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"{source}: cannot read: {err}") from None
    if args.file is not None:
        return np.array(engine.tokenizer.encode(text, add_special=True), dtype=np.int64)
    ids = np.array(parse_id_list(text, "--tokens"), dtype=np.int64)
    if ids.min() < 0 or ids.max() >= engine.config.vocab_size:
        raise BadInputError(f"--tokens {source}: ids must be in 0..{engine.config.vocab_size - 1}")
    return ids


def run(args: argparse.Namespace) -> int:
    from gufo.tools.quality.compare import compare_to_reference
    from gufo.tools.quality.reference import ReferenceLogits, candidate_rows, record_reference
    from gufo.tools.quality.validate_prefill import add_prefill_noise

    if args.reference is not None and (args.file or args.tokens):
        raise BadInputError("--reference brings its own tokens: drop -f/--tokens")
    if args.save_logits is not None and (args.max_kl is not None or args.min_top1 is not None):
        raise BadInputError("--max-kl/--min-top1 gate a --reference comparison")
    reference = ReferenceLogits.load(args.reference) if args.reference is not None else None
    engine = make_engine(args)
    noise = parse_noise()
    if noise is not None:
        add_prefill_noise(engine, *noise)
    if reference is None:
        tokens = read_tokens(args, engine)
        meta = {"model": engine.path.name, "device": engine.device, "routes": engine.model.routes()}
        meta["gufo_version"] = __version__
        saved = record_reference(engine, tokens, args.chunk, args.top_k, meta)
        saved.save(args.save_logits)
        kept = "full vocabulary" if saved.full else f"top-{saved.logits.shape[1]}"
        print(
            f"[Quality] saved {len(saved.positions)} positions ({kept}) of {len(tokens)} tokens "
            f"to {args.save_logits}"
        )
        return 0
    report = compare_to_reference(reference, candidate_rows(engine, reference))
    for line in report.lines():
        print(line)
    if args.json:
        print(json.dumps(report.as_dict()))
    failures = []
    if report.nonfinite_candidate:
        failures.append(f"{report.nonfinite_candidate} candidate position(s) not finite")
    if args.max_kl is not None and not report.kl_mean <= args.max_kl:
        failures.append(f"mean KL {report.kl_mean:.6g} exceeds --max-kl {args.max_kl}")
    if args.min_top1 is not None and not 100 * report.top1_agreement >= args.min_top1:
        failures.append(
            f"top-1 agreement {100 * report.top1_agreement:.3f}% is below --min-top1 {args.min_top1}"
        )
    if failures:
        raise CheckFailedError("quality gate failed: " + "; ".join(failures))
    return 0

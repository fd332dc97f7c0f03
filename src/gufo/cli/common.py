"""Flags shared by several commands, and turning them into library objects."""

from __future__ import annotations

import argparse

from gufo.errors import BadInputError
from gufo.gguf.aliases import ALIASES, DEFAULT_MODEL
from gufo.runtime.engine import DEFAULT_BATCH, DEFAULT_CONTEXT
from gufo.runtime.sampling import SamplingParams


def _int_at_least(minimum: int, wording: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {wording}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def add_model_flag(parser: argparse.ArgumentParser, required: bool = False) -> None:
    aliases = ", ".join(sorted(ALIASES))
    parser.add_argument(
        "-m",
        "--model",
        required=required,
        default=None,
        help=f"GGUF file path or alias ({aliases}); default: {DEFAULT_MODEL}"
        if not required
        else f"GGUF file path or alias ({aliases})",
    )


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    add_model_flag(parser)
    parser.add_argument("--device", default="cpu", help="where to run: cpu (default) or cuda[:N]")
    parser.add_argument(
        "-c",
        "--ctx-size",
        type=positive_int,
        default=DEFAULT_CONTEXT,
        help=f"context size in tokens (KV cache length), capped at the model's (default {DEFAULT_CONTEXT})",
    )
    parser.add_argument(
        "-b",
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH,
        help=f"prompt tokens per forward pass during prefill (default {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "-t",
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads (default: torch's default, usually the number of cores)",
    )


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    defaults = SamplingParams()
    group = parser.add_argument_group("sampling (llama.cpp order: penalty, top-k, top-p, min-p, temperature)")
    group.add_argument(
        "--temp",
        type=float,
        default=defaults.temperature,
        help=f"temperature; 0 = greedy argmax, ties to the lowest id (default {defaults.temperature})",
    )
    group.add_argument(
        "--top-k",
        type=non_negative_int,
        default=defaults.top_k,
        help=f"keep the K most likely tokens; 0 = off (default {defaults.top_k})",
    )
    group.add_argument(
        "--top-p",
        type=float,
        default=defaults.top_p,
        help=f"nucleus sampling threshold; 1.0 = off (default {defaults.top_p})",
    )
    group.add_argument(
        "--min-p",
        type=float,
        default=defaults.min_p,
        help=f"drop tokens below min-p times the top probability; 0 = off (default {defaults.min_p})",
    )
    group.add_argument(
        "--repeat-penalty",
        type=float,
        default=defaults.repeat_penalty,
        help=f"penalty for recently seen tokens; 1.0 = off (default {defaults.repeat_penalty})",
    )
    group.add_argument(
        "--repeat-last-n",
        type=int,
        default=defaults.repeat_last_n,
        help=f"how many recent tokens the penalty sees; -1 = all (default {defaults.repeat_last_n})",
    )
    group.add_argument("-s", "--seed", type=int, default=None, help="random seed (default: random)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    if args.temp < 0:
        raise BadInputError(f"--temp must be >= 0, got {args.temp}")
    if not 0.0 < args.top_p <= 1.0:
        raise BadInputError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        raise BadInputError(f"--min-p must be in [0, 1], got {args.min_p}")
    if args.repeat_penalty <= 0:
        raise BadInputError(f"--repeat-penalty must be > 0, got {args.repeat_penalty}")
    return SamplingParams(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        repeat_last_n=args.repeat_last_n,
        seed=args.seed,
    )


def make_engine(args: argparse.Namespace):
    from gufo.runtime.engine import Engine

    return Engine(
        args.model,
        device=args.device,
        context=args.ctx_size,
        batch_size=args.batch_size,
        threads=args.threads,
    )


def parse_id_list(text: str, flag: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").strip("[]").split(",") if part]
    except ValueError:
        raise BadInputError(f"{flag}: expected comma-separated token ids, got {text!r}") from None
    if not ids:
        raise BadInputError(f"{flag}: no token ids given")
    return ids

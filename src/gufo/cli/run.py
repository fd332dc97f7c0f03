"""`gufo run`: generate a continuation of a prompt, streamed to stdout."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from gufo.cli.chat import add_conversation_flags, converse
from gufo.cli.commands import summary
from gufo.cli.common import (
    add_engine_flags,
    add_sampling_flags,
    add_speculative_flags,
    add_tensor_parallel_flag,
    int_in,
    make_engine,
    sampling_params,
    speculative_params,
)
from gufo.errors import BadInputError

log = logging.getLogger(__name__)
n_predict = int_in(-1, "a token count, or -1 for as many as the context holds")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help=summary("run"),
        description="Generate a continuation of PROMPT and stream it to stdout. A timing line (prompt and "
        "generation tokens per second) goes to stderr. With -cnv (or -i), hold a conversation instead, as "
        "`gufo chat` does (its flags are under 'conversation').",
    )
    add_engine_flags(parser)
    add_tensor_parallel_flag(parser)
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "-p", "--prompt", help="prompt text (BOS is added when the model asks); with -cnv the first user turn"
    )
    source.add_argument(
        "-f", "--file", type=Path, help="read the prompt text (or -cnv's first turn) from this file (UTF-8)"
    )
    parser.add_argument(
        "-cnv",
        "--conversation",
        "-i",
        "--interactive",
        dest="conversation",
        action="store_true",
        help="conversation mode (llama.cpp's -cnv and -i): the `gufo chat` loop, with -p or -f as the first "
        "user turn and -n as the most tokens per reply",
    )
    parser.add_argument(
        "-n",
        "--n-predict",
        type=n_predict,
        default=128,
        help="number of tokens to generate (with -cnv, per reply); -1: until end of text or a full context "
        "(default 128). More than the context holds after the prompt is cut to what it holds, with a warning",
    )
    parser.add_argument(
        "-r",
        "--reverse-prompt",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop once the generated text contains TEXT (printed up to and with it); repeatable",
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens"
    )
    parser.add_argument(
        "--no-special", action="store_true", help="treat special-token text in the prompt as plain text"
    )
    parser.add_argument(
        "-sp",
        "--special",
        action="store_true",
        help="print control tokens (like <end_of_turn> or <start_of_image>) as their text; by default "
        "they print as nothing, as in llama.cpp (user-defined tokens always print)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print [TokenTrace]: count=N sha256=H of the generated ids, the kernel route of each "
        "op and, with --speculative, [Speculative]: drafted=D accepted=A acceptance=A/D steps=S on stderr",
    )
    add_conversation_flags(parser)
    add_sampling_flags(parser)
    add_speculative_flags(parser)
    parser.set_defaults(func=run)


# the flags of one mode only (-cnv or not): in the other they are refused by name, never ignored
CONVERSATION_ONLY = {
    "system_prompt": "-sys",
    "chat_template": "--chat-template",
    "verbose_prompt": "--verbose-prompt",
    "no_cache_prompt": "--no-cache-prompt",
}
COMPLETION_ONLY = {
    "ignore_eos": "--ignore-eos",
    "no_special": "--no-special",
    "special": "--special",
    "reverse_prompt": "--reverse-prompt",
    "verbose": "--verbose",
}


def check_mode(args: argparse.Namespace) -> None:
    others = COMPLETION_ONLY if args.conversation else CONVERSATION_ONLY
    given = [flag for dest, flag in others.items() if getattr(args, dest)]
    if given:
        raise BadInputError(f"{', '.join(given)}: only {'without' if args.conversation else 'with'} -cnv")
    if not args.conversation and args.prompt is None and args.file is None:
        raise BadInputError("one of -p/--prompt and -f/--file is required (or -cnv for a conversation)")


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return args.prompt
    try:
        return args.file.read_text(encoding="utf-8")
    except OSError as err:
        raise BadInputError(f"--file {args.file}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise BadInputError(f"--file {args.file}: not UTF-8 text: {err}") from None


def tokens_to_generate(requested: int, prompt_length: int, context: int) -> int:
    """-n as the context allows: the last token is sampled, not decoded, so a prompt of P tokens leaves
    room for context - P + 1; -1 asks for all of it, more is cut to it with a warning."""
    room = context - prompt_length + 1
    if requested < 0:
        return room
    if requested > room:
        log.warning(
            "-n %d does not fit the context: %d of its %d tokens are the prompt, so at most %d are "
            "generated (-c sets the context)",
            requested, prompt_length, context, room,
        )  # fmt: skip
        return room
    return requested


def reverse_prompt_watch(texts: list[str]):
    """A function told each piece of printed text, True once any of `texts` has appeared."""
    keep = max(map(len, texts), default=1) - 1  # what a match may still need from earlier pieces
    seen = ""

    def appeared(piece: str) -> bool:
        nonlocal seen
        seen = (seen[-keep:] if keep else "") + piece
        return any(text in seen for text in texts)

    return appeared


def run(args: argparse.Namespace) -> int:
    from gufo.engine.speculative import make_speculator
    from gufo.engine.trace import token_trace_line
    from gufo.parallel.engine import follows
    from gufo.parallel.mirror import follow

    check_mode(args)
    if args.conversation:
        return converse(args, None if args.prompt is None and args.file is None else read_prompt(args))
    params = sampling_params(args)
    speculative = speculative_params(args)
    if "" in args.reverse_prompt:
        raise BadInputError("--reverse-prompt: empty text")
    prompt = read_prompt(args)  # a missing file is one line before any model loads
    engine = make_engine(args)
    if follows(engine):  # tensor-parallel rank > 0: run rank 0's steps, print nothing
        return follow(engine)
    speculator = make_speculator(engine, speculative, args.draft_model) if speculative else None
    tok = engine.tokenizer
    prompt_ids = tok.encode(prompt, add_special=True, parse_special=not args.no_special)
    engine.check_fits(len(prompt_ids))
    count = tokens_to_generate(args.n_predict, len(prompt_ids), engine.context)
    stream = tok.stream_decoder(skip_special=not args.special)
    appeared = reverse_prompt_watch(args.reverse_prompt) if args.reverse_prompt else None

    def emit(token: int) -> bool:
        """Print the token's text; True when a reverse prompt has appeared."""
        if not args.ignore_eos and token in tok.eog_ids:
            return False
        text = stream.push(token)
        sys.stdout.write(text)
        sys.stdout.flush()
        return appeared is not None and appeared(text)

    result = (speculator or engine).generate(
        prompt_ids, count, params, stop_at_eog=not args.ignore_eos, on_token=emit
    )
    sys.stdout.write(stream.flush() + "\n")
    sys.stdout.flush()
    if args.show_timings:
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

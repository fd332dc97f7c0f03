"""`gufo chat`: an interactive conversation using the model's chat template."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gufo.cli.commands import summary
from gufo.cli.common import (
    add_engine_flags,
    add_sampling_flags,
    add_speculative_flags,
    make_engine,
    positive_int,
    sampling_params,
    speculative_params,
)
from gufo.engine.engine import GenerationResult
from gufo.engine.loader import open_checked
from gufo.engine.speculative import make_speculator
from gufo.errors import BadInputError
from gufo.gguf.aliases import CHAT_MODEL
from gufo.tokenizer.chat import BUILTIN_TEMPLATES

TEMPLATE_KEY = "tokenizer.chat_template"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help=summary("chat"),
        description="Read user turns from stdin (one line each; /exit or EOF ends, /reset clears the "
        "history), render the conversation with the GGUF chat template and stream the reply. A model "
        "without a chat template (a base model) is refused unless --chat-template gives one.",
    )
    add_engine_flags(parser)
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument(
        "-n", "--n-predict", type=positive_int, default=512, help="maximum tokens per reply (default 512)"
    )
    add_chat_template_flag(parser)
    add_sampling_flags(parser)
    add_speculative_flags(parser)
    parser.set_defaults(func=run)


def add_chat_template_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        default=None,
        help=f"render the conversation with a built-in template ({', '.join(BUILTIN_TEMPLATES)}) or a "
        f"jinja file instead of the GGUF's {TEMPLATE_KEY} (default: the GGUF's; required when it has none)",
    )


def chat_template(args: argparse.Namespace) -> str | None:
    """The jinja source --chat-template names, or None for the GGUF's own template. A model without
    one is refused before its weights load: a base model continues the rendered turns with junk."""
    choice = args.chat_template
    names = ", ".join(BUILTIN_TEMPLATES)
    if choice is None:
        _, model_file = open_checked(args.model)
        if model_file.get(TEMPLATE_KEY) is None:
            raise BadInputError(
                f"{model_file.label} has no chat template ({TEMPLATE_KEY}): chat with an instruct model "
                f"(-m {CHAT_MODEL}) or give one with --chat-template NAME|FILE (NAME: {names})"
            )
        return None
    if choice in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[choice]
    try:
        return Path(choice).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or err
        raise BadInputError(
            f"--chat-template {choice}: not a built-in template ({names}) nor a readable file: {reason}"
        ) from None


@contextmanager
def sigint_stops_reply() -> Iterator[Callable[[], bool]]:
    """While a reply streams, Ctrl-C (SIGINT) asks it to stop at its next token, as in llama-cli, instead
    of ending the session; a second one before it stops does end it (KeyboardInterrupt: exit 130). Yields
    whether a stop was asked for. The handler only sets a flag, so no model step is cut in the middle."""
    requested = threading.Event()

    def handler(signum, frame) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def stream_reply(generator, tokenizer, ids: list[int], budget: int, params) -> tuple[str, GenerationResult]:
    """Generate a reply to the rendered conversation `ids` and print it as it comes: its text (what was
    printed until Ctrl-C, if that stopped it) and the generation's result."""
    stream = tokenizer.stream_decoder()
    pieces: list[str] = []

    def emit(token: int) -> None:
        if token in tokenizer.eog_ids:
            return
        pieces.append(stream.push(token))
        sys.stdout.write(pieces[-1])
        sys.stdout.flush()

    try:
        with sigint_stops_reply() as stop_requested:
            result = generator.generate(ids, budget, params, on_token=emit, should_stop=stop_requested)
    except KeyboardInterrupt:
        sys.stdout.write("\n")  # the interruption's message on a line of its own
        raise
    pieces.append(stream.flush())
    sys.stdout.write(pieces[-1] + "\n")
    sys.stdout.flush()
    return "".join(pieces), result


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    speculative = speculative_params(args)
    template = chat_template(args)
    engine = make_engine(args)
    generator = make_speculator(engine, speculative, args.draft_model) if speculative else engine
    tok = engine.tokenizer
    base = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(base)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            messages = list(base)
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, template=template)
        ids = tok.encode(prompt, add_special=True, parse_special=True)
        budget = min(args.n_predict, engine.context - len(ids))
        if budget <= 0:
            raise BadInputError(f"conversation of {len(ids)} tokens fills the context size {engine.context}")
        # a reply stopped by Ctrl-C stays in the conversation as far as it went (llama-cli keeps it too)
        reply, _ = stream_reply(generator, tok, ids, budget, params)
        messages.append({"role": "assistant", "content": reply})

"""`gufo chat`: an interactive conversation using the model's chat template."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

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
from gufo.errors import BadInputError
from gufo.gguf.aliases import CHAT_MODEL
from gufo.tokenizer.chat import BUILTIN_TEMPLATES

if TYPE_CHECKING:  # the engine (torch) is imported when a conversation starts, not for --help
    from gufo.engine.engine import GenerationResult
    from gufo.tokenizer import Tokenizer

TEMPLATE_KEY = "tokenizer.chat_template"
PROMPT = "> "
CLEAR_COMMANDS = ("/clear", "/reset")
EXIT_COMMAND = "/exit"
KEYS = (
    "/clear forgets the conversation; /exit, Ctrl-D or Ctrl-C at the prompt end the session (exit 0); "
    "Ctrl-C during a reply stops it; the arrow keys edit the line and recall earlier ones"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help=summary("chat"),
        description="Read user turns from stdin, one line each, render the conversation with the GGUF chat "
        "template and stream each reply to stdout; a timing line follows it on stderr. On a terminal: "
        f"{KEYS}. A reply stopped by Ctrl-C stays in the conversation as far as it went (as in "
        "llama-cli). A model without a chat template (a base model) is refused unless --chat-template "
        "gives one.",
    )
    add_engine_flags(parser)
    parser.add_argument(
        "-n", "--n-predict", type=positive_int, default=512, help="maximum tokens per reply (default 512)"
    )
    add_conversation_flags(parser)
    add_sampling_flags(parser)
    add_speculative_flags(parser)
    parser.set_defaults(func=run)


def add_conversation_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("conversation (gufo chat, gufo run -cnv)")
    group.add_argument(
        "-sys",
        "--system-prompt",
        "--system",
        dest="system_prompt",
        metavar="TEXT",
        default=None,
        help="system prompt: the conversation's first message (kept by /clear)",
    )
    group.add_argument(
        "--chat-template",
        metavar="NAME|FILE",
        default=None,
        help=f"render the conversation with a built-in template ({', '.join(BUILTIN_TEMPLATES)}) or a "
        f"jinja file instead of the GGUF's {TEMPLATE_KEY} (default: the GGUF's; required when it has none)",
    )
    group.add_argument(
        "--show-timings",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after each reply (and `gufo run`'s text), its prompt and generation tokens and tokens per "
        "second on stderr, as llama-cli prints them (default: on)",
    )
    group.add_argument(
        "--no-cache-prompt",
        action="store_true",
        help="prefill each turn's whole conversation again. By default the KV the last turn left is kept, "
        "and a turn prefills only what follows the prefix it shares with it (llama-cli keeps its context "
        "too); a reply is the same either way, where prefill is chunked the reused prefix stops at whole "
        "-b chunks of prefilled tokens. With --speculative every turn is prefilled whole",
    )
    group.add_argument(
        "--verbose-prompt",
        action="store_true",
        help="print each rendered conversation (the chat template's output) on stderr before its reply",
    )


def chat_template(args: argparse.Namespace) -> str | None:
    """The jinja source --chat-template names, or None for the GGUF's own template. A model without
    one is refused before its weights load: a base model continues the rendered turns with junk."""
    from gufo.engine.loader import open_checked

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
    return named_template(choice)


def named_template(choice: str) -> str:
    """The jinja source of a built-in template's NAME or of a FILE."""
    names = ", ".join(BUILTIN_TEMPLATES)
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

    def handler(signum: int, frame: object) -> None:
        if requested.is_set():
            raise KeyboardInterrupt
        requested.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield requested.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def stream_reply(
    generate: Callable[..., GenerationResult], tokenizer: Tokenizer
) -> tuple[str, GenerationResult]:
    """Run `generate(on_token=...)` (a reply's generation, told each token) and print the reply as it
    comes: its text (what was printed until Ctrl-C, if that stopped it) and the generation's result."""
    stream = tokenizer.stream_decoder(skip_special=True)  # control tokens print as nothing, as in llama-cli
    pieces: list[str] = []

    try:
        with sigint_stops_reply() as stop_requested:

            def emit(token: int) -> bool:
                """Print the token's text; True (stop after it) once Ctrl-C was pressed."""
                if token not in tokenizer.eog_ids:
                    pieces.append(stream.push(token))
                    sys.stdout.write(pieces[-1])
                    sys.stdout.flush()
                return stop_requested()

            result = generate(on_token=emit)
    except KeyboardInterrupt:
        sys.stdout.write("\n")  # the interruption's message on a line of its own
        raise
    pieces.append(stream.flush())
    sys.stdout.write(pieces[-1] + "\n")
    sys.stdout.flush()
    return "".join(pieces), result


def read_turns(terminal: bool, first: str | None = None) -> Iterator[str]:
    """The user's turns: `first` (`gufo run -cnv -p`), then a line each from stdin until its end, Ctrl-D
    or, on a terminal, Ctrl-C at the prompt (llama-cli ends there too). On a terminal, GNU readline
    edits the line and keeps the history the up arrow recalls."""
    if terminal:
        import readline  # noqa: F401 (importing it gives input() line editing and history)

    if first is not None:
        if terminal:
            print(PROMPT + first)
        yield first
    while True:
        try:
            yield input(PROMPT if terminal else "")
        except (EOFError, KeyboardInterrupt):
            if terminal:
                print()  # what follows (the shell's prompt) starts on a line of its own
            return


def timings_line(result: GenerationResult) -> str:
    cached = f" ({result.cached_tokens} cached)" if result.cached_tokens else ""
    return (
        f"[ Prompt: {len(result.prompt_ids)} tokens{cached}, {result.prompt_tps:.1f} t/s | "
        f"Generation: {len(result.generated_ids)} tokens, {result.generation_tps:.1f} t/s ]"
    )


def run(args: argparse.Namespace) -> int:
    return converse(args)


def converse(args: argparse.Namespace, first_turn: str | None = None) -> int:
    """The conversation loop of `gufo chat` and `gufo run -cnv`; `first_turn` is the first user turn."""
    from gufo.engine.prompt_cache import PromptCache
    from gufo.engine.speculative import make_speculator
    from gufo.parallel.engine import follows
    from gufo.parallel.mirror import follow

    params = sampling_params(args)
    speculative = speculative_params(args)
    template = chat_template(args)
    engine = make_engine(args)
    if follows(engine):  # tensor-parallel rank > 0 (`gufo run -cnv -tp N`): run rank 0's steps
        return follow(engine)
    generator = make_speculator(engine, speculative, args.draft_model) if speculative else engine
    # a Speculator's verification passes keep their own account of the slot
    prompt_cache = None if speculative or args.no_cache_prompt else PromptCache(engine, engine.batch_size)
    tok = engine.tokenizer
    system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    messages = list(system)
    terminal = sys.stdin.isatty()
    if terminal:
        print(KEYS, file=sys.stderr)
    for line in read_turns(terminal, first_turn):
        command = line.strip()
        if command == EXIT_COMMAND:
            break
        if command in CLEAR_COMMANDS:
            messages = list(system)
            print("conversation cleared", file=sys.stderr)
            continue
        if not command:
            continue
        messages.append({"role": "user", "content": line})
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, template=template)
        if args.verbose_prompt:
            print(prompt, file=sys.stderr)
        ids = tok.encode(prompt, add_special=True, parse_special=True)
        room = engine.context - len(ids)
        if room <= 0:
            messages.pop()
            print(
                f"gufo: the conversation of {len(ids)} tokens fills the context size {engine.context}: "
                "/clear starts over (or give a larger -c)",
                file=sys.stderr,
            )
            continue
        # a reply stopped by Ctrl-C stays in the conversation as far as it went (llama-cli keeps it too)
        budget = room if args.n_predict < 0 else min(args.n_predict, room)  # `run -cnv -n -1`: all of it
        if prompt_cache is None:
            generate = partial(generator.generate, ids, budget, params)
        else:
            generate = partial(engine.generate, ids, budget, params, prompt_cache=prompt_cache)
        reply, result = stream_reply(generate, tok)
        messages.append({"role": "assistant", "content": reply})
        if args.show_timings:
            print(timings_line(result), file=sys.stderr)
    return 0

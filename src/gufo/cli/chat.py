"""`gufo chat`: an interactive conversation using the model's chat template."""

from __future__ import annotations

import argparse
import sys

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
from gufo.engine.speculative import make_speculator
from gufo.errors import BadInputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help=summary("chat"),
        description="Read user turns from stdin (one line each; /exit or EOF ends, /reset clears the "
        "history), render the conversation with the GGUF chat template and stream the reply.",
    )
    add_engine_flags(parser)
    parser.add_argument("--system", default=None, help="system prompt")
    parser.add_argument(
        "-n", "--n-predict", type=positive_int, default=512, help="maximum tokens per reply (default 512)"
    )
    add_sampling_flags(parser)
    add_speculative_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    speculative = speculative_params(args)
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
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        ids = tok.encode(prompt, add_special=True, parse_special=True)
        stream = tok.stream_decoder()
        pieces: list[str] = []

        def emit(token: int, stream=stream, pieces=pieces) -> None:
            if token in tok.eog_ids:
                return
            text = stream.push(token)
            pieces.append(text)
            sys.stdout.write(text)
            sys.stdout.flush()

        budget = min(args.n_predict, engine.context - len(ids))
        if budget <= 0:
            raise BadInputError(f"conversation of {len(ids)} tokens fills the context size {engine.context}")
        generator.generate(ids, budget, params, on_token=emit)
        tail = stream.flush()
        pieces.append(tail)
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": "".join(pieces)})

"""`gufo tokenize`: show how a model's tokenizer splits text."""

from __future__ import annotations

import argparse

from gufo.cli.commands import summary
from gufo.cli.common import add_model_flag


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tokenize",
        help=summary("tokenize"),
        description="Tokenize PROMPT like llama.cpp (BOS only when the GGUF says add_bos_token).",
    )
    add_model_flag(parser)
    parser.add_argument("-p", "--prompt", required=True, help="text to tokenize")
    parser.add_argument("--ids", action="store_true", help="print only the ids, as [1, 2, 3]")
    parser.add_argument("--no-bos", action="store_true", help="never add BOS")
    parser.add_argument(
        "--parse-special",
        action="store_true",
        help="match special-token text (like <|im_start|>) as single tokens",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gufo.gguf.aliases import resolve_model
    from gufo.gguf.model_file import open_model_file
    from gufo.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(open_model_file(resolve_model(args.model)).metadata)
    ids = tok.encode(args.prompt, add_special=not args.no_bos, parse_special=args.parse_special)
    if args.ids:
        print(f"[{', '.join(str(i) for i in ids)}]")
    else:
        for token in ids:
            print(f"{token:>7} -> {tok.token_text(token)!r}")
    return 0

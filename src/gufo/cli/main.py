"""`gufo` entry point: dispatches to one module per command."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from gufo import __version__
from gufo.errors import GufoError

# Each module exposes `register(subparsers)`, which adds its parser and sets `func`.
COMMAND_MODULES = [
    "run",
    "chat",
    "tokenize",
    "logits",
    "info",
    "bench",
    "compare",
    "parity",
    "quality",
    "kernels",
    "synth",
    "serve",
    "bench_serve",
]


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), like every other bad input; --help has the details."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gufo",
        description="Local LLM inference for GGUF models, with measurement tools for engine tuners.",
    )
    parser.add_argument("--version", action="version", version=f"gufo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"gufo.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"gufo.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except GufoError as err:
        print(f"gufo: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("gufo: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

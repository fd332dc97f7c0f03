"""`gufo` entry point: dispatches to one module per command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from gufo import __version__
from gufo.cli.commands import COMMANDS
from gufo.cli.progress import configure_logging
from gufo.errors import GufoError


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), like every other bad input; --help has the details. Flags
    are matched whole: a llama.cpp flag gufo lacks is refused by name, never taken as a prefix of
    another flag nor split into a short flag and its value (argparse reads `-ngl` as `-n gl` and `-cnv`
    as `-c nv`). The command parsers are of this class too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self._refuse_unknown_flags(args)
        return super().parse_known_args(args, namespace)

    def _refuse_unknown_flags(self, args: list[str]) -> None:
        """Name the first flag this parser does not know, before argparse reports anything else (a
        missing required flag, or `-n`'s complaint about the value `gl`). The scan stops where a
        subcommand's arguments begin: its own parser checks them."""
        subcommands = [a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        for arg in args:
            if arg == "--" or any(arg in choices for choices in subcommands):
                return
            if self._unknown_flag(arg):
                self.error(f"unknown flag {arg.split('=', 1)[0]}")

    def _unknown_flag(self, arg: str) -> bool:
        # what argparse itself takes for a value: "-", negative numbers, text with spaces
        if len(arg) < 2 or arg[0] != "-" or " " in arg or _is_number(arg):
            return False
        if arg.split("=", 1)[0] in self._option_string_actions:
            return False
        attached = self._option_string_actions.get(arg[:2]) if arg[1] != "-" else None
        # a short flag with its number attached (-n32, -t4) is argparse's own syntax
        return not (attached is not None and attached.nargs != 0 and _is_number(arg[2:]))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def requested_command(argv: list[str]) -> str | None:
    """The command argv names (its first argument that is not an option), if it is one."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only `command`'s module is imported (each exposes `register(subparsers)`, which
    adds its parser and sets `func`), the other commands are listed by name and summary."""
    parser = OneLineParser(
        prog="gufo",
        description="Local LLM inference for GGUF models, with measurement tools for engine tuners.",
    )
    parser.add_argument("--version", action="version", version=f"gufo {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, (module, summary) in COMMANDS.items():
        if name == command:
            importlib.import_module(f"gufo.cli.{module}").register(subparsers)
        else:
            subparsers.add_parser(name, help=summary)
    return parser


# OpenMP threads that wait at a barrier spin by default (libgomp: for about 300k spins), which on a busy
# machine steals the cores the other threads need: gemma3-270m decoded at 0.45-1.78 tok/s with 2 threads
# on a loaded 2-core machine, 23 with passive waiting (docs/BENCHMARKS.md, "CPU threads"). Read by the
# OpenMP runtime when torch loads it, so set before any command imports torch; the user's value wins.
WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault(*WAIT_POLICY)
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(requested_command(argv))
    args = parser.parse_args(argv)
    configure_logging(args)
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

"""What a command says on stderr while it works: gufo's log records as `gufo: ...` lines (its stages,
such as assembling the default model or compiling the CPU kernels, are INFO records), and the model's
load: a byte bar on a terminal, else a line when it starts and one when it ends.

Stages and the load are shown on a terminal, or anywhere with --progress; --quiet (--log-disable)
hides them. Warnings and errors are always shown."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext


class StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is when a record comes (a test's capture swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class LineFormatter(logging.Formatter):
    """`gufo: message` for progress (INFO), `gufo: warning: message` above it."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return (
            f"gufo: {text}" if record.levelno <= logging.INFO else f"gufo: {record.levelname.lower()}: {text}"
        )


def shows_progress(args: argparse.Namespace) -> bool:
    if getattr(args, "quiet", False):
        return False
    return getattr(args, "progress", False) or sys.stderr.isatty()


def add_progress_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="report the stages of loading the model on stderr, one line each (default: a progress bar "
        "when stderr is a terminal)",
    )
    parser.add_argument(
        "--quiet",
        "--log-disable",
        dest="quiet",
        action="store_true",
        help="no progress or stage lines on stderr (warnings, errors and timings still)",
    )


def configure_logging(args: argparse.Namespace) -> None:
    """gufo's records on stderr as one line each: its stages (INFO) when progress is shown."""
    root = logging.getLogger()
    if not any(isinstance(handler, StderrHandler) for handler in root.handlers):
        handler = StderrHandler()
        handler.setFormatter(LineFormatter("%(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    logging.getLogger("gufo").setLevel(logging.INFO if shows_progress(args) else logging.WARNING)


class LoadReport:
    """Told (tensor bytes read, all tensor bytes) by the engine as the model loads."""

    def __init__(self, name: str, bar: bool):
        self.name, self.with_bar = name, bar
        self.bar = None
        self.started: float | None = None
        self.done = 0

    def __call__(self, done: int, total: int) -> None:
        if self.started is None:
            self.started = time.perf_counter()
            if self.with_bar:
                from tqdm import tqdm

                self.bar = tqdm(
                    total=total, unit="B", unit_scale=True, desc=f"loading {self.name}", file=sys.stderr,
                    leave=False,
                )  # fmt: skip
            else:
                print(
                    f"gufo: loading {self.name}: {total / 1e6:.0f} MB of tensors", file=sys.stderr, flush=True
                )
        if self.bar is not None:
            self.bar.update(done - self.done)
        self.done = done

    def close(self, loaded: bool) -> None:
        if self.bar is not None:
            self.bar.close()
        if loaded and self.started is not None:
            seconds = time.perf_counter() - self.started
            print(
                f"gufo: loaded {self.name} ({self.done / 1e6:.0f} MB) in {seconds:.1f} s",
                file=sys.stderr,
                flush=True,
            )


@contextmanager
def load_reported(args: argparse.Namespace, name: str) -> Iterator[LoadReport | None]:
    """The engine's load progress for `name` while the block runs (None when progress is not shown)."""
    if not shows_progress(args):
        yield None
        return
    bar = sys.stderr.isatty()
    report = LoadReport(name, bar)
    if bar:
        from tqdm.contrib.logging import logging_redirect_tqdm

        redirect = logging_redirect_tqdm()  # stage lines above the bar, not through it
    else:
        redirect = nullcontext()
    loaded = False
    try:
        with redirect:
            yield report
        loaded = True
    finally:
        report.close(loaded)

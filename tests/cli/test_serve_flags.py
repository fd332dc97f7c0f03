"""`gufo serve`'s engine batch size: -b when given, else --prefill-chunk (so a full chunk is one pass)."""

from __future__ import annotations

import pytest

from gufo.cli.main import build_parser
from gufo.cli.serve import batch_size
from gufo.options import DEFAULT_BATCH


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ([], 512),
        (["--prefill-chunk", "256"], 256),
        (["-b", "64"], 64),
        (["-b", "64", "--prefill-chunk", "256"], 64),
    ],
)
def test_the_batch_size_defaults_to_the_prefill_chunk(flags, want):
    assert batch_size(build_parser("serve").parse_args(["serve", *flags])) == want


def test_other_commands_keep_their_batch_default():
    assert build_parser("run").parse_args(["run", "-p", "x"]).batch_size == DEFAULT_BATCH

"""Fuzz the readers with mutated fixtures: every input ends in kernels or one BadInputError, within a
bounded amount of work and memory. Runs only with GUFO_FUZZ=1 (e.g. `GUFO_FUZZ=1 pytest tests/kernel_check -m
fuzz`)."""

from __future__ import annotations

import os
import resource
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernres_oracles import CUDA, HIP

from gufo.errors import BadInputError
from gufo.tools.kernel_check import read_path

SEEDS = [
    HIP / "kernels.clang22.gfx942.hsaco",
    HIP / "bundle.clang19.hipfb",
    HIP / "ccob2.clang19.hipfb",
    HIP / "ccob3.clang22.hipfb",
    HIP / "ccob3-zlib.hipfb",
    HIP / "host.clang22.so",
    HIP / "host.clang19.dll",
    CUDA / "kernels.sm_90.cubin",
    CUDA / "kernels.fatbin",
]
DATA = {p.name: p.read_bytes() for p in SEEDS}
EXAMPLES = int(os.environ.get("GUFO_FUZZ_EXAMPLES", "3000"))
MEMORY_LIMIT = 4 << 30
# Work, counted in Python trace events (calls, lines, returns), not seconds, so a busy machine cannot fail
# it: reading a seed takes at most 2.1e5 events (ccob3.clang22.hipfb, 17.7 kB) and a reader whose work
# follows the bytes and the entries actually present does the same on a mutated file of that size (at
# most 64 bytes longer). 1e7, 50x the most, trips only on work the input does not pay for: a loop over a
# count or size field read from the file (2**32 iterations) instead of over what is there.
WORK_LIMIT = 10_000_000


class WorkLimitExceeded(BaseException):
    """Raised by the tracer: a BaseException, so no reader's `except Exception` swallows it."""


def limited_work(function, *args):
    """function(*args), failing once it has taken WORK_LIMIT trace events."""
    events = 0

    def tracer(frame, event, arg):
        nonlocal events
        events += 1
        if events > WORK_LIMIT:
            raise WorkLimitExceeded(f"more than {WORK_LIMIT} trace events")
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return function(*args)
    finally:
        sys.settrace(previous)
        assert events <= WORK_LIMIT, f"the readers took more than {WORK_LIMIT} trace events"


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(DATA[draw(st.sampled_from(sorted(DATA)))])
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["flip", "word", "truncate", "insert", "zero"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "word":  # header fields: sizes, offsets, counts
            value = draw(st.sampled_from([0, 1, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 2**63, 2**64 - 1]))
            data[pos : pos + 8] = value.to_bytes(8, "little")
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(max_size=64))
        elif op == "zero":
            data[pos : pos + draw(st.integers(1, 256))] = bytes(256)[: len(data[pos : pos + 256])]
    return bytes(data)


@pytest.mark.fuzz
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(mutated(), st.binary(max_size=4096)))
def test_readers_never_crash(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "input.bin"
    path.write_bytes(data)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, hard))
    try:
        kernels, _ = limited_work(read_path, path)
        assert kernels
    except BadInputError as err:
        assert str(err).startswith(f"{path}: ") and "\n" not in str(err)
        if log := os.environ.get("GUFO_FUZZ_LOG"):  # to review which messages users would see
            with open(log, "a") as f:
                f.write(str(err).split(": ", 1)[1][:200] + "\n")
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

"""Commands that need no model start without torch or triton: `gufo --help`, `gufo compare`, `gufo
kernels report` run with both made unimportable, and `gufo --help` costs under 0.5 s of CPU."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import HANG_GUARD_S

TESTS = Path(__file__).resolve().parents[1]
# the CLI in a fresh interpreter where importing torch or triton (or any submodule) fails
WITHOUT_TORCH = """
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ImportError(f"{name} is unimportable in this test")
sys.meta_path.insert(0, Refuse())
from gufo.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def without_torch(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", WITHOUT_TORCH, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--help"], "compare benchmark runs"),
        (
            ["compare", str(TESTS / "bench/fixtures/llamabench_a.json"),
             str(TESTS / "bench/fixtures/llamabench_b.json")],
            "pp512",
        ),
        (["kernels", "report", str(TESTS / "kernel_check/fixtures/cuda/kernels.sm_80.cubin")], "sm_80"),
    ],
)  # fmt: skip
def test_runs_without_torch_or_triton(args, expected):
    done = without_torch(*args)
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_help_costs_under_half_a_second_of_cpu():
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "gufo.cli.main", "--help"], capture_output=True, timeout=HANG_GUARD_S
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.5, f"gufo --help took {cpu:.2f} s of CPU"


def test_a_flag_is_never_taken_as_a_prefix_of_another(capsys):
    """llama.cpp's `--ctx` is not gufo's `--ctx-size`: refused by name, in one line (exit 2)."""
    from tests.conftest import gufo

    with pytest.raises(SystemExit) as stop:
        gufo(capsys, "run", "--ctx", "64", "-p", "hi")
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert "unrecognized arguments: --ctx 64" in err and len(err.strip().splitlines()) == 1

"""Commands that need no model start without torch or triton: `gufo --help`, `gufo compare`, `gufo
kernels report` run with both made unimportable, `gufo --help` costs under 0.5 s of CPU, and every
command's usage errors come within a second of CPU (its module imports no engine to register its flags)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gufo.cli.commands import COMMANDS
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


def cpu_seconds_of(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    """User + system CPU seconds of `gufo ARGS` in a fresh interpreter, and its result."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "gufo.cli.main", *args], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def test_help_costs_under_half_a_second_of_cpu():
    cpu, done = cpu_seconds_of("--help")
    assert done.returncode == 0
    assert cpu < 0.5, f"gufo --help took {cpu:.2f} s of CPU"


def test_kernels_report_costs_under_a_second_of_cpu():
    cpu, done = cpu_seconds_of(
        "kernels", "report", str(TESTS / "kernel_check/fixtures/cuda/kernels.sm_80.cubin")
    )
    assert done.returncode == 0 and "sm_80" in done.stdout
    assert cpu < 1.0, f"gufo kernels report took {cpu:.2f} s of CPU"


# chat's module still imports the engine at its top (its rework is under way): add it when it does not
@pytest.mark.parametrize("command", [name for name in COMMANDS if name != "chat"])
def test_usage_error_costs_under_a_second_of_cpu(command):
    """`gufo run --bad-flag` imported torch (8 s) before it said anything: now argparse answers at once."""
    cpu, done = cpu_seconds_of(command, "--bad-flag")
    assert done.returncode == 2 and "--bad-flag" in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert cpu < 1.0, f"gufo {command} --bad-flag took {cpu:.2f} s of CPU"


def test_a_flag_is_never_taken_as_a_prefix_of_another(capsys):
    """llama.cpp's `--ctx` is not gufo's `--ctx-size`: refused by name, in one line (exit 2)."""
    from tests.conftest import gufo

    with pytest.raises(SystemExit) as stop:
        gufo(capsys, "run", "--ctx", "64", "-p", "hi")
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.splitlines() == ["gufo run: error: unknown flag --ctx (see gufo run --help)"]


def test_single_dash_flags_are_never_split(capsys):
    """argparse read llama.cpp's `-ngl 99` as `-n gl` (then complained about `gl`): a single-dash flag
    gufo lacks is refused by name, while a short flag with its number attached is still argparse's."""
    from gufo.cli.main import build_parser
    from tests.conftest import gufo

    with pytest.raises(SystemExit) as stop:
        gufo(capsys, "run", "-p", "hi", "-xyz", "1")
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "gufo run: error: unknown flag -xyz (see gufo run --help)"
    ]
    args = build_parser("run").parse_args(["run", "-p", "hi", "-n32", "-t=2", "--temp", "-0.5"])
    assert (args.n_predict, args.threads, args.temperature) == (32, 2, -0.5)

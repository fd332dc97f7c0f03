"""Shared fixtures: the real models (from their PyPI packages) and llama.cpp's goldens in ../shared."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gufo.cli.main import main

REPO = Path(__file__).resolve().parents[1]
# GUFO_SHARED: where the shared oracles are when not beside the checkout (e.g. copied to a GPU machine)
SHARED = Path(os.environ.get("GUFO_SHARED", REPO.parent / "shared"))
# GUFO_TEST_DEVICE: run the real-model golden checks on another device (cuda) with the same limits
DEVICE = os.environ.get("GUFO_TEST_DEVICE", "cpu")
GOLDENS = SHARED / "goldens"

# A guard against a hang (a deadlocked collective, a server that never answers), never a measure of speed:
# a subprocess or wait that passes it has stopped, not slowed. An hour: a loaded 2-core machine took
# 4462 s for the whole suite, and no single step of a test is a tenth of it.
HANG_GUARD_S = 3600

# Hypothesis' timing checks off for every property test (explicit @settings inherit this): a 200 ms
# per-example deadline and the too_slow health check measure the machine's load, not the code.
settings.register_profile("gufo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gufo")

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1",
    "gemma3-270m": "gemma-3-270m-q4_k_m",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that run on one xdist worker together")
    worker = getattr(config, "workerinput", None)
    if worker is not None:  # a pytest-xdist worker: the cores shared out, not each worker taking all of them
        import torch

        threads = max(1, len(os.sched_getaffinity(0)) // int(worker["workercount"]))
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the CLI subprocesses the tests start


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """`--dist loadgroup` (pyproject.toml) sends a whole test file to one worker, so module and session
    fixtures (a served model, a recorded reference) are built once, except where the file deals its tests
    into groups itself (the Triton interpreter's cases: tests/kernels/triton_interpreter.py)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def gufo(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: exit code, stdout, stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def golden(alias: str) -> dict:
    return json.loads((GOLDENS / f"{MODELS[alias]}.json").read_text())


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """torch's thread count is process-wide and `Engine(threads=N)`, `-t N` and the tensor-parallel tests
    set it: restore it after every test, so a test's numbers never depend on which tests ran before it."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the shared oracle folder is missing beside the checkout ({SHARED.name}/)")
    return SHARED


@pytest.fixture(scope="session")
def model_path():
    from gufo.gguf.aliases import resolve_model

    return resolve_model

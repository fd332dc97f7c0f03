"""Shared fixtures: the real models (from their PyPI packages) and llama.cpp's goldens in ../shared."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

# Idle OpenMP threads (torch's, the C kernels') sleep instead of spinning: set before torch is imported
# here, and inherited by the xdist workers and the subprocesses. Only how a waiting thread waits, never a
# result; but a test that runs 2 threads (-t 2) while the other worker holds the second core spun at every
# barrier: test_markdown_header_and_test_names took 24.6 CPU seconds so, 6.1 passive.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import gguf  # noqa: E402
import pytest  # noqa: E402
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


# The tier of every test, by what it uses (pyproject.toml registers the markers): the longest key that is a
# prefix of the test's nodeid wins; a test may be in golden and system both. gpu is marked in the files.
#   unit    no model files, no subprocess or server (tiny models written by the test are fine)
#   golden  ../shared's goldens or vocabularies, the model packages, or the converter/transformers oracles
#   system  subprocesses (the CLI, the Triton interpreter's worker, torchrun) or a server
TIERS: dict[str, tuple[str, ...]] = {
    "tests/bench/": ("unit",),
    "tests/bench/test_bench_cli.py": ("golden",),
    "tests/cli/": ("golden",),
    "tests/cli/test_cli.py::test_bad_flag_is_usage_error": ("system",),
    "tests/cli/test_chat.py::test_terminal_session_ctrl_c_history_and_ctrl_d": ("golden", "system"),
    "tests/cli/test_llama_flags.py::test_gpu_layers_pick_the_device": ("unit",),
    "tests/cli/test_llama_flags.py::test_what_gufo_cannot_do_is_one_line_before_loading": ("unit",),
    "tests/cli/test_llama_flags.py::test_accepted_flags_parse_whole": ("unit",),
    "tests/cli/test_llama_flags.py::test_threads_beyond_the_cores_warn": ("unit",),
    "tests/cli/test_llama_flags.py::test_mlock_locks_the_memory_or_warns_that_it_could_not": ("system",),
    "tests/cli/test_llama_flags.py::test_not_a_reference_is_named_without_numpy_advice": ("unit",),
    "tests/cli/test_llama_flags.py::test_compare_names_the_missing_run": ("unit",),
    "tests/cli/test_llama_flags.py::test_kernels_own_without_triton_says_what_to_install": ("system",),
    "tests/cli/test_progress.py::test_records_become_gufo_lines": ("unit",),
    "tests/cli/test_serve_flags.py": ("unit",),
    "tests/cli/test_startup.py": ("system",),
    "tests/cli/test_startup.py::test_a_flag_is_never_taken_as_a_prefix_of_another": ("unit",),
    "tests/cli/test_startup.py::test_single_dash_flags_are_never_split": ("unit",),
    "tests/engine/": ("golden",),
    "tests/engine/test_graph_rows.py": ("unit",),
    "tests/engine/test_prefill_chunks.py": ("unit",),
    "tests/engine/test_batch_masker.py": ("unit",),
    "tests/engine/test_json_object.py": ("unit",),
    "tests/engine/test_json_closing.py": ("unit",),
    "tests/engine/test_sampling.py": ("unit",),
    "tests/engine/test_prompt_cache.py": ("unit",),
    "tests/formats/test_quant_blocks.py": ("unit",),
    "tests/formats/test_quant_models.py": ("unit",),
    "tests/formats/test_quant_real_files.py": ("golden",),
    "tests/gguf/": ("unit",),
    "tests/gguf/test_model_file.py::test_cli_exit_code_and_single_line": ("system",),
    "tests/gguf/test_split_model.py": ("golden",),
    "tests/kernel_check/": ("unit",),
    "tests/kernel_check/test_own.py::test_nvidia_fields_match_cuobjdump": ("system",),
    "tests/kernel_check/test_own.py::test_kernels_compile_for_amd_with_a_triton_without": ("system",),
    "tests/kernels/": ("unit",),
    "tests/kernels/test_delta_rule.py": ("golden",),
    "tests/kernels/test_fla_delta_rule.py": ("unit",),
    "tests/kernels/test_triton_attention.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_elementwise.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_gemv.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_experts.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_experts_prefill.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_recurrent.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_rows_int8.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_rows_half.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_prefill_tiles.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_routing.py::test_kernel_in_interpreter": ("system",),
    "tests/kernels/test_triton_gemv.py::test_int8_limit_not_a_whole_number_is_one_error_line": ("system",),
    "tests/kernels/test_triton_gemv.py::test_package_imports_without_triton": ("system",),
    "tests/models/": ("golden",),
    "tests/models/test_converted_vs_transformers.py": ("golden", "system"),  # the converter runs apart
    "tests/parallel/": ("golden",),
    "tests/profile/": ("golden",),
    "tests/profile/test_stages.py": ("unit",),
    "tests/parallel/test_tp_equivalence.py": ("golden", "system"),
    "tests/parallel/test_tp_torchrun.py": ("golden", "system"),
    "tests/quality/": ("golden",),
    "tests/quality/test_validate_prefill.py::test_metrics_by_hand": ("unit",),
    "tests/server/": ("golden", "system"),
    "tests/server/test_bench_client.py": ("system",),
    "tests/server/test_reply.py": ("unit",),
    "tests/server/test_prefix_sharing.py": ("unit",),
    "tests/server/test_scheduler_rows.py": ("unit",),
    "tests/server/test_queued_steps.py": ("unit",),
    "tests/server/test_state_checkpoints.py": ("unit",),
    "tests/server/test_responses_events.py": ("unit",),
    "tests/synth/": ("golden",),
    "tests/tokenizer/": ("golden",),
    "tests/test_import_time.py": ("system",),
    "tests/test_layers.py": ("unit",),
}

# Scheduling only, never a test's result: the groups (test files, or the interpreter's halves) that take the
# most CPU, dealt out first after the unit tier, longest first, so that no long group starts last and leaves
# a core idle. CPU seconds (user+sys, the test's subprocesses included) from runs of the files alone on the
# 2-core machine (pytest -n 0, one torch thread; 2026-12-02, after the interpreter's and the converted
# files' cuts; the interpreter's halves each hold half the cases of all four tests/kernels/test_triton_*).
LONG_GROUPS = (
    "tests/kernel_check/test_own.py",  # 130
    "tests/cli/test_speculative_cli.py",  # 85
    "tests/models/test_converted_vs_transformers.py",  # 65
    "tests/parallel/test_tp_torchrun.py",  # 55
    "tests/server/test_determinism.py",  # 42
    "tests/server/test_speculative_serve.py",  # 39
    "triton-interpreter-0",  # 34
    "tests/quality/test_quality.py",  # 33
    "triton-interpreter-1",  # 32
    "tests/engine/test_speculative.py",  # 27
    "tests/server/test_responses_api.py",  # 16
)


def tiers_of(nodeid: str) -> tuple[str, ...]:
    keys = [key for key in TIERS if nodeid.startswith(key)]
    return TIERS[max(keys, key=len)] if keys else ()


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that run on one xdist worker together")
    worker = getattr(config, "workerinput", None)
    if worker is not None:  # a pytest-xdist worker: the cores shared out, not each worker taking all of them
        import torch

        threads = max(1, len(os.sched_getaffinity(0)) // int(worker["workercount"]))
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the CLI subprocesses the tests start


def group_of(item) -> str:
    return item.get_closest_marker("xdist_group").args[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """The tier markers (TIERS; gpu tests skipped without CUDA), and the groups: `--dist loadgroup`
    (pyproject.toml) sends a whole test file to one worker, so module and session fixtures (a served
    model, a recorded reference) are built once, except where the file deals its tests into groups itself
    (the Triton interpreter's cases: tests/kernels/triton_interpreter.py). Then the order, which under
    xdist (`--no-loadscope-reorder`) is the order groups are dealt out in: the unit tier first, then
    LONG_GROUPS, then the rest as collected."""
    import torch

    no_gpu = pytest.mark.skip(reason="needs a GPU")
    unknown = []
    for item in items:
        tiers = tiers_of(item.nodeid)
        if not tiers:
            unknown.append(item.nodeid)
        for tier in tiers:
            item.add_marker(tier)
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if unknown:
        raise pytest.UsageError(f"no tier for {unknown[0]} (and {len(unknown) - 1} more): add it to TIERS")

    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(group_of(item), []).append(item)

    def rank(group: str) -> tuple[int, int]:
        if all(item.get_closest_marker("unit") is not None for item in groups[group]):
            return (0, 0)
        return (1, LONG_GROUPS.index(group)) if group in LONG_GROUPS else (2, 0)

    # each group's tests together (a module's fixtures set up once also without xdist), in collection order
    items[:] = [item for group in sorted(groups, key=rank) for item in groups[group]]


@pytest.hookimpl(tryfirst=True)  # before xdist sends the collection to the scheduler
def pytest_collection_finish(session):
    """pytest-xdist (3.8) tells its loadgroup scheduler a test's group by appending `@group` to the test's
    nodeid, which it does by assigning `item._nodeid`; pytest 9.2 keeps the id as `item._id` (a NodeId)
    and ignores that (pytest-dev/pytest-xdist#1386), so every test was dealt out alone: a file's module
    fixtures built on both workers, each interpreter group run by both. Append it where it did not take."""
    if getattr(session.config, "workerinput", None) is None or not session.config.getvalue("loadgroup"):
        return
    for item in session.items:
        suffix, node_id = "@" + group_of(item), getattr(item, "_id", None)
        if node_id is not None and not isinstance(node_id, str) and not item.nodeid.endswith(suffix):
            item._id = type(node_id).parse(item.nodeid + suffix)


def gufo(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: exit code, stdout, stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@functools.cache
def gguf_reader(path: Path) -> gguf.GGUFReader:
    """The `gguf` package's reader of a model file (the tests' oracle of its layout and metadata), read
    once per test process: it takes 4-5 CPU s over a 49k-token vocabulary. Shared: never modify it."""
    return gguf.GGUFReader(path)


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


@pytest.fixture(scope="session", autouse=True)
def kernels_registered():
    """The kernels of this machine's backends registered, as the engine does when it opens a device
    (`backends.select`): the tests that build a model directly (`build_model(file, "cpu")`) get the same
    registry whichever tests ran before them in the process."""
    import torch

    from gufo.kernels import backends

    backends.select("cpu")
    if torch.cuda.is_available():
        backends.select("cuda")


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the shared oracle folder is missing beside the checkout ({SHARED.name}/)")
    return SHARED


@pytest.fixture(scope="session")
def model_path():
    from gufo.gguf.aliases import resolve_model

    return resolve_model

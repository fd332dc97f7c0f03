"""Running Triton kernel checks in the Triton interpreter, on the CPU.

`triton.jit` (triton.language's own helpers included) chooses the interpreter when a function is
decorated, i.e. when triton is first imported, and any earlier test may already have imported it
compiled. So the kernel checks run in a worker subprocess started with TRITON_INTERPRET=1 (this file
run as a script: it imports the test modules and prints their cases' results as JSON), and each case is
reported in the parent as its own test (`interpreter_tests`).

Every test module's cases are dealt into WORKERS groups, each group one subprocess for the cases of all
the modules collected (torch and Triton imported once, not once per module), marked `xdist_group` so
that under `pytest -n 2 --dist loadgroup` (the default, pyproject.toml) the two groups run at the same
time on the two test workers, each group once; without xdist the groups run one after the other.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

WORKERS = 2  # interpreter subprocesses: the test workers of the default run
# Parent side: what each collected test module's worker runs (its file, its cases in order), and the
# results of each group once its subprocess has run: group -> module file -> case -> failure or None.
MODULES: dict[str, list[str]] = {}
RESULTS: dict[int, dict[str, dict[str, str | None]]] = {}


def fix_interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter turns loop bounds into ints with int(1-element array), a TypeError since
    numpy 2.4 (triton-lang/triton#9171, fixed upstream by #9172): convert with .item() instead."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched


def patch_language_once_per_launch() -> None:
    """Triton 3.6's interpreter patches triton.language again at every call of a @triton.jit helper inside
    a kernel (an `inspect.getmembers` walk of the language modules each time: a third of a case's CPU),
    though the launch patched those same modules already and restores them when the kernel returns.
    Skip the repeat when every language module the helper sees is patched (its `load` no longer the
    builtin); a helper that needed the patch and missed it would fail, never pass wrongly."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._patch_lang

    def patch_unless_patched(fn):
        langs = [value for value in fn.__globals__.values() if value is tl or value is tl.core]
        if langs and not any(tl.core.is_builtin(lang.load) for lang in langs):
            return None  # inside a launch: its scope holds the patches
        return original(fn)

    interpreter._patch_lang = patch_unless_patched


def numpy_types_looked_up_once() -> None:
    """Triton 3.6's interpreter maps a Triton type to its numpy type by building a 19-entry dict of
    numpy dtypes at every call (every cast, splat and masked load of every program). Look each scalar
    type up once; block types map as their element type and pointers to uint64, as the original does.
    With `tuple_type_names_when_read`: 15-25% less CPU per case (the attention and GEMV cases)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._get_np_dtype
    found: dict = {}

    def numpy_type(tt_dtype):
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(scalar, tl.pointer_type):
            return np.dtype(np.uint64)
        if scalar not in found:
            found[scalar] = original(scalar)
        return found[scalar]

    interpreter._get_np_dtype = numpy_type


def tuple_type_names_when_read() -> None:
    """Every Triton tensor the interpreter makes holds its shape as a `tl.tuple`, whose type formats its
    name string at construction ("[:constexpr_type[16],...]"), though only printing reads it (equality
    and mangling read the types). Format it when read instead: the same string from the same types and
    fields."""
    from triton.language import core

    def init(self, types, fields=None) -> None:
        self.types = types
        self.fields = fields or [""] * len(types)

    def name(self) -> str:
        return "[" + ",".join([f"{k}:{v}" for k, v in zip(self.fields, self.types, strict=False)]) + "]"

    core.tuple_type.__init__ = init
    core.tuple_type.name = property(name)


def no_overflow_checks_that_are_dropped() -> None:
    """Triton 3.6's interpreter recomputes every integer add, subtract and multiply in int64 and
    compares it with the type's bounds (six more interpreted operations each: a third of an attention
    case's CPU), then hands the comparison to `device_assert`, which drops it unless the builder's
    options ask for debug; the interpreter's never do (InterpreterOptions.debug is False, TRITON_DEBUG
    or not: an int32 product that overflows passes unreported either way). Skip the computation
    wherever it would be dropped."""
    from triton.language.semantic import TritonSemantic

    original = TritonSemantic.binary_op_sanitize_overflow_impl

    def sanitize_overflow(self, lhs, rhs, binary_op) -> None:
        if self.builder.options.debug:
            original(self, lhs, rhs, binary_op)

    TritonSemantic.binary_op_sanitize_overflow_impl = sanitize_overflow


def run_cases(cases: dict[str, Callable[[], None]], names: list[str]) -> dict[str, str | None]:
    """Worker side: the failure (traceback text) or None of each case of `names`."""
    results: dict[str, str | None] = {}
    for name in names:
        try:
            cases[name]()
            results[name] = None
        except Exception:
            results[name] = traceback.format_exc(limit=-4)
    return results


def run_modules(request: dict[str, list[str]]) -> dict[str, dict[str, str | None]]:
    """Worker side: each test module of `request` (file -> case names) imported, its cases run."""
    fix_interpreter_loop_bounds()
    patch_language_once_per_launch()
    numpy_types_looked_up_once()
    tuple_type_names_when_read()
    no_overflow_checks_that_are_dropped()
    results = {}
    for script, names in request.items():
        spec = importlib.util.spec_from_file_location(Path(script).stem, script)
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        results[script] = run_cases(module.interpreter_cases(), names)
    return results


def worker_results(group: int) -> dict[str, dict[str, str | None]]:
    """Parent side: run the interpreter worker on this group's cases of every collected module and read
    its results. The interpreter runs every case in Python on the CPU: minutes, many more on a busy
    machine, so no time limit but the guard against a hang."""
    from tests.conftest import HANG_GUARD_S  # parent side only: the worker runs as a plain script

    request = {script: names[group::WORKERS] for script, names in MODULES.items()}
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, __file__, json.dumps(request)]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the interpreter worker hung: no result after {HANG_GUARD_S} s")
    if proc.returncode != 0:
        pytest.fail(f"the interpreter worker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def interpreter_tests(cases: Callable[[], dict[str, Callable[[], None]]], script: str) -> Callable:
    """The parent side of a test module whose cases the worker runs: one parametrized test per case, its
    group's worker run when a test of the group first asks; bind it at module level under its name."""
    names = list(cases())
    MODULES[script] = names
    group_of = {name: index % WORKERS for index, name in enumerate(names)}
    params = [
        pytest.param(name, marks=pytest.mark.xdist_group(f"triton-interpreter-{group_of[name]}"))
        for name in names
    ]

    @pytest.mark.parametrize("case", params)
    def test_kernel_in_interpreter(case):
        group = group_of[case]
        if group not in RESULTS:
            RESULTS[group] = worker_results(group)
        result = RESULTS[group][script]
        assert set(result) == set(names[group::WORKERS])  # every case of the module's group ran
        assert result[case] is None, result[case]

    return test_kernel_in_interpreter


if __name__ == "__main__":  # the interpreter worker (TRITON_INTERPRET=1 was set before importing triton)
    print(json.dumps(run_modules(json.loads(sys.argv[1]))))

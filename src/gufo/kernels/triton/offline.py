"""Compile gufo's Triton kernels for a GPU target on the CPU, in the configurations the engine launches.

`own_fixtures.LAUNCH_EXAMPLES` run the kernel modules' real launch code on meta tensors (no memory, no
GPU) for reference model shapes. `variants` intercepts those launches (JITFunction.run) instead of
running them, so the list of configurations is whatever the launch code picks, never a copy of it; on
AMD targets `torch.version.hip` is set while it runs, so ROCm-only decisions are taken too.
`compile_variant` then specialises the recorded arguments exactly as Triton's JIT does at launch
(divisibility, integers equal to 1, AMD pointer ranges) and compiles with `triton.compile`.
"""

from __future__ import annotations

import fnmatch
import multiprocessing
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from gufo.kernels.catalog import DEFAULT_OPTIONS
from gufo.kernels.triton import dependent_launch
from gufo.kernels.triton.own_fixtures import LAUNCH_EXAMPLES
from gufo.options import KernelOptions

TARGETS = {
    "gfx1151": GPUTarget("hip", "gfx1151", 32),
    "gfx1100": GPUTarget("hip", "gfx1100", 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "sm_80": GPUTarget("cuda", 80, 32),
    "sm_90": GPUTarget("cuda", 90, 32),
}


@dataclass(frozen=True)
class Variant:
    """One launch configuration: `name` = kernel[label,constexprs,num_warps], e.g.
    gemv_q4_k[q4_k,BLOCK_M=1,BLOCK_N=4,STEP=2048,num_warps=4]."""

    name: str
    kernel: JITFunction
    args: tuple  # as launched (meta tensors and integers)
    kwargs: dict[str, Any]  # constexprs and launch options


def variants(
    target: str, options: KernelOptions = DEFAULT_OPTIONS, first_only: tuple[str, ...] = ()
) -> list[Variant]:
    """The distinct configurations the launch code uses on `target` with the kernels built with
    `options` (first shape wins for each name); of the kernels whose name matches one of the globs
    `first_only`, only the first configuration recorded."""
    recorder = _Recorder()
    gpu = TARGETS[target]
    with (
        mock.patch.object(JITFunction, "run", recorder.record),
        mock.patch.object(torch.version, "hip", "offline" if gpu.backend == "hip" else None),
        mock.patch.object(dependent_launch, "supported", lambda _: gpu.backend == "cuda" and gpu.arch >= 90),
    ):
        for examples in LAUNCH_EXAMPLES:
            for label in examples(options):
                recorder.label = label  # the launches made until the next label
    kept, sampled = [], set()
    for variant in recorder.found.values():
        name = variant.kernel.__name__
        if any(fnmatch.fnmatchcase(name, glob) for glob in first_only):
            if name in sampled:
                continue
            sampled.add(name)
        kept.append(variant)
    return kept


class _Recorder:
    """Stands in for JITFunction.run (patched on the class, so `kernel` is the JITFunction)."""

    def __init__(self) -> None:
        self.label = ""
        self.found: dict[str, Variant] = {}

    @property
    def record(self) -> Callable:
        def run(kernel: JITFunction, *args, grid, warmup, **kwargs) -> None:
            settings = ",".join(f"{k}={v}" for k, v in kwargs.items())
            name = f"{kernel.__name__}[{self.label},{settings}]"
            self.found.setdefault(name, Variant(name, kernel, args, kwargs))

        return run


def compile_variant(variant: Variant, target: str, cache: Path) -> Path:
    """Compile as the JIT would at this launch; the folder holding the binary and Triton's metadata JSON."""
    gpu = TARGETS[target]
    backend = make_backend(gpu)
    kernel = variant.kernel
    kwargs = dict(variant.kwargs)
    kwargs.setdefault("debug", kernel.debug or knobs.runtime.debug)  # as JITFunction.run sets them
    kwargs.setdefault("instrumentation_mode", knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*variant.args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    with knobs.cache.scope():
        knobs.cache.dir = str(cache)
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs, attrs), target=gpu, options=options.__dict__
        )
    binary = next(p for f, p in compiled.metadata_group.items() if f.endswith("." + backend.binary_ext))
    return Path(binary).parent


Progress = Callable[[int, int, str, str], None]  # done, total, target, variant name


def compile_all(
    targets: list[str],
    cache: Path,
    jobs: int = 1,
    progress: Progress | None = None,
    options: KernelOptions = DEFAULT_OPTIONS,
    first_only: tuple[str, ...] = (),
) -> list[tuple[str, Variant, Path]]:
    """(target, variant, folder) for every variant of every target (`variants`), the kernels built
    with `options`; `jobs` > 1 compiles in worker processes (forked, so they share the recorded
    launches)."""
    work = [(t, v) for t in targets for v in variants(t, options, first_only)]
    results: list[tuple[str, Variant, Path]] = []

    def done(target: str, variant: Variant, folder: Path) -> None:
        results.append((target, variant, folder))
        if progress:
            progress(len(results), len(work), target, variant.name)

    if jobs <= 1 or not sys.platform.startswith("linux"):
        for target, variant in work:
            done(target, variant, compile_variant(variant, target, cache))
        return results
    global _WORK
    _WORK = work
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(jobs, mp_context=context) as pool:
        folders = pool.map(_compile_nth, range(len(work)), [cache] * len(work))
        for (target, variant), folder in zip(work, folders, strict=True):
            done(target, variant, folder)
    return results


_WORK: list[tuple[str, Variant]] = []  # what forked workers compile, by index


def _compile_nth(index: int, cache: Path) -> Path:
    target, variant = _WORK[index]
    return compile_variant(variant, target, cache)

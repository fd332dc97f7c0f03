"""`gufo kernels own`: compile gufo's own Triton kernels for GPU targets on the CPU and read them back.

Each compiled variant is read with the Triton cache reader (its folder holds the binary and Triton's
metadata JSON) and named after its launch configuration, so allowance keys are `TARGET/VARIANT`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from gufo.errors import BadInputError
from gufo.options import KernelOptions
from gufo.tools.kernel_check import triton
from gufo.tools.kernel_check.checker import kernel_key
from gufo.tools.kernel_check.loader import read_path
from gufo.tools.kernel_check.model import Kernel

Progress = Callable[[int, int, str, str], None]  # done, total, target, variant name


def own_kernels(
    targets: list[str],
    keep: str | None = None,
    jobs: int = 1,
    block_size: int | None = None,
    progress: Progress | None = None,
    options: KernelOptions | None = None,
    first_only: tuple[str, ...] = (),
) -> tuple[list[Kernel], list[str]]:
    """Every launch variant of every target, the kernels built with `options` (the defaults when None),
    compiled (into `keep`, else a temporary folder) and read; of the kernels matching a glob of
    `first_only`, only their first variant."""
    from gufo.kernels import triton as triton_kernels

    if not triton_kernels.AVAILABLE:
        raise BadInputError("kernels own compiles gufo's Triton kernels: install Triton (pip install triton)")
    try:
        from gufo.kernels.triton import offline
    except ImportError as err:  # torch, or a part of Triton
        raise BadInputError(f"kernels own needs the `{err.name}` package ({err})") from None
    unknown = [t for t in targets if t not in offline.TARGETS]
    if unknown:
        raise BadInputError(f"--target: unknown target {unknown[0]!r} (known: {', '.join(offline.TARGETS)})")
    if jobs < 1:
        raise BadInputError(f"--jobs: {jobs} is not a positive number")
    if keep is not None:
        try:
            Path(keep).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise BadInputError(f"--keep {keep}: cannot create: {err.strerror or err}") from None
    holder = nullcontext(keep) if keep is not None else tempfile.TemporaryDirectory(prefix="gufo-own-")
    kernels: list[Kernel] = []
    warnings: list[str] = []
    with holder as cache:
        compiled = offline.compile_all(
            list(dict.fromkeys(targets)), Path(cache), jobs, progress, options or KernelOptions(), first_only
        )
        for _, variant, folder in compiled:
            found, notes = read_path(folder, block_size)
            for k in found:
                k.name = k.display_name = variant.name  # the symbol stays in `container`
            kernels += found
            # every kernel here has Triton's launch-time shared memory: that note would only be noise
            warnings += [n for n in notes if triton.LAUNCH_NOTE not in n]
    return kernels, warnings


def allowance_for(allowance: dict, kernels: list[Kernel]) -> dict:
    """The allowance restricted to the targets compiled now (one file may hold several targets)."""
    targets = {kernel_key(k).split("/", 1)[0] for k in kernels}
    entries = {key: v for key, v in allowance.get("kernels", {}).items() if key.split("/", 1)[0] in targets}
    return allowance | {"kernels": entries}

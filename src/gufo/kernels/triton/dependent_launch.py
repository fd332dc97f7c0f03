"""Programmatic dependent launch (NVIDIA sm_90 and later) for the kernels of a decode step.

A decode step is a chain of a few hundred small kernels, each of which waits in the stream for the one
before it to finish, then pays its own launch and ramp-up. Launched with the programmatic-serialization
attribute (`DependentLaunch.options`), a kernel's programs may become resident while the kernel before
it still runs: each starts with `wait_for_inputs`, which blocks (`griddepcontrol.wait`) until the
previous kernel has completed and its writes are visible, and only then lets the next kernel launch
early in turn.
Nothing a kernel reads from the chain is read before its wait, so results are bit for bit those of
plain launches (`gufo kernels own` checks the order in the compiled code). The wait comes before
the early launch: docs/decisions.md, "Dependent launches: wait, then let the next kernel launch".

The products of small weight matrices also ask L2 for their weight rows before they wait
(`prefetch_rows`): weights depend on no earlier kernel (docs/decisions.md, "weight prefetch only for
small matrices", hence `PREFETCH_MAX_BYTES`).

On other devices (AMD, older NVIDIA, the Triton interpreter) the PDL and PREFETCH constexprs are False
and both compile to nothing. `DependentLaunch(enabled=False)` (KernelOptions.dependent_launch) turns
dependent launches off (plain stream order, e.g. to compare profiles).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton built without its CUDA backend (ROCm-only): PDL is never True there

    @triton.jit
    def gdc_wait():
        pass

    @triton.jit
    def gdc_launch_dependents():
        pass


PREFETCH_MAX_BYTES = 8 << 20  # weight matrices up to this size prefetch their rows before waiting


@functools.cache
def _capability(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def supported(device: torch.device) -> bool:
    """Whether kernels on `device` may be launched dependently: compiled (not interpreted) for NVIDIA
    sm_90 or later (`gufo kernels own` patches this with the target it compiles for)."""
    return (
        device.type == "cuda"
        and torch.version.hip is None
        and not triton.knobs.runtime.interpret
        and _capability(device) >= 9
    )


@dataclass(frozen=True)
class DependentLaunch:
    """The launch policy of the kernels: whether they launch dependently where the device supports it."""

    enabled: bool

    def options(self, device: torch.device) -> dict[str, bool]:
        """Keyword arguments for launching a kernel that starts with `wait_for_inputs(PDL)` on `device`."""
        if self.enabled and supported(device):
            return {"PDL": True, "launch_pdl": True}
        return {"PDL": False}

    def prefetches(self, device: torch.device, weight_bytes: int) -> bool:
        """Whether a product of a weight matrix of `weight_bytes` on `device` prefetches its rows."""
        return self.enabled and supported(device) and weight_bytes <= PREFETCH_MAX_BYTES


class LaunchedKernel:
    """A registered Triton kernel: it launches under the policy it is built with."""

    def __init__(self, launch: DependentLaunch) -> None:
        self.launch = launch


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Block until the previous kernel's writes are visible, then let the next kernel launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def prefetch_rows(plane_ptr, N, row_elements, BLOCK_N: tl.constexpr):
    """Ask L2 for the rows pid(0) * BLOCK_N.. (at most N) of a row-major plane of `row_elements` per
    row: one bulk prefetch of the 16-byte aligned span, issued by the program's first thread."""
    first = tl.program_id(0).to(tl.int64) * BLOCK_N
    last = tl.minimum(first + BLOCK_N, N)
    start = (plane_ptr + first * row_elements).to(tl.int64) & -16
    end = ((plane_ptr + last * row_elements).to(tl.int64) + 15) & -16
    tl.inline_asm_elementwise(
        "{ .reg .pred %pf; .reg .u32 %tf; mov.u32 %tf, %tid.x; setp.eq.u32 %pf, %tf, 0; "
        "@%pf cp.async.bulk.prefetch.L2.global [$1], $2; } // dummy $0",
        "=r,l,r", [start, (end - start).to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip

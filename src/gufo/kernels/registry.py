"""Kernel registry: (backend, op, qtype) -> kernel, filled by `gufo.kernels.catalog.register_all`.

Every backend kernel is registered beside the torch reference for the same (op, qtype); the reference
is the oracle in tests and the fallback when a backend has no kernel (or cannot build one here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from gufo.kernels import profiling
from gufo.kernels.contracts import Kernel, Op

REFERENCE_BACKEND = "torch"
AnyQType = None  # registry key meaning "every qtype without a specific entry"

KernelType = TypeVar("KernelType", bound=Kernel)


@dataclass(frozen=True)
class Registration:
    """One entry a kernel module provides: `kernel` for `op` on `backend`, for one qtype or any."""

    backend: str
    op: Op[Any]
    kernel: Kernel
    qtype: Any = AnyQType


_KERNELS: dict[tuple[str, str, Any], Kernel] = {}


def register(entry: Registration) -> None:
    """Add (or replace) one kernel."""
    _KERNELS[(entry.backend, entry.op.name, entry.qtype)] = entry.kernel


def find(backend: str, op: Op[KernelType], qtype: Any = AnyQType) -> tuple[str, KernelType] | None:
    """(backend actually used, kernel): the backend's available kernel, else the torch reference's,
    else None. Inside `profiling.ranges(options)`, the kernel runs its calls in profiler ranges."""
    found = _find(backend, op, qtype)
    options = profiling.active()
    if found is None or options is None:
        return found
    return found[0], profiling.ranged(found[1], op, qtype, options)  # type: ignore[return-value]


def _find(backend: str, op: Op[KernelType], qtype: Any) -> tuple[str, KernelType] | None:
    name = op.name
    for key in ((backend, name, qtype), (backend, name, AnyQType)):
        kernel = _KERNELS.get(key)
        if kernel is not None and kernel.available():
            return key[0], kernel  # type: ignore[return-value]  # registered under this op
    for key in ((REFERENCE_BACKEND, name, qtype), (REFERENCE_BACKEND, name, AnyQType)):
        if key in _KERNELS:
            return REFERENCE_BACKEND, _KERNELS[key]  # type: ignore[return-value]
    return None


def lookup(backend: str, op: Op[KernelType], qtype: Any = AnyQType) -> tuple[str, KernelType]:
    """As `find`, raising KeyError when neither the backend nor the reference has a kernel."""
    found = find(backend, op, qtype)
    if found is None:
        raise KeyError(f"no kernel for op {op.name!r} and type {qtype!r} on backend {backend!r}")
    return found

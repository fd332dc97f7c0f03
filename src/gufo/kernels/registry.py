"""Kernel registry: (backend, op, qtype) -> implementation.

Every backend kernel is registered beside the torch reference for the same (op, qtype); the reference
is the oracle in tests and the fallback when a backend has no kernel (or cannot build one here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REFERENCE_BACKEND = "torch"
AnyQType = None  # registry key meaning "every qtype without a specific entry"

_KERNELS: dict[tuple[str, str, Any], Any] = {}


def register(backend: str, op: str, qtype: Any = AnyQType) -> Callable[[Any], Any]:
    def decorate(impl: Any) -> Any:
        _KERNELS[(backend, op, qtype)] = impl
        return impl

    return decorate


def lookup(backend: str, op: str, qtype: Any = AnyQType) -> tuple[str, Any]:
    """Return (backend actually used, implementation); falls back to the torch reference."""
    for key in ((backend, op, qtype), (backend, op, AnyQType)):
        impl = _KERNELS.get(key)
        if impl is not None and getattr(impl, "available", lambda: True)():
            return key[0], impl
    for key in ((REFERENCE_BACKEND, op, qtype), (REFERENCE_BACKEND, op, AnyQType)):
        if key in _KERNELS:
            return REFERENCE_BACKEND, _KERNELS[key]
    raise KeyError(f"no kernel for op {op!r} and type {qtype!r}")

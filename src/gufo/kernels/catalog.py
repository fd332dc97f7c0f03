"""Which kernels exist for a backend: `register_all` fills the registry from the kernel modules' tables.

Nothing registers at import; the torch reference kernels (the oracles and the fallback) are registered
with every backend. Calling it again (other options) replaces the entries it registers.
"""

from __future__ import annotations

from collections.abc import Iterator

from gufo.kernels import (
    attention,
    causal_conv,
    cpu_int8,
    decode,
    delta_rule,
    linear_reference,
    norm,
    pointwise,
    routing,
)
from gufo.kernels.registry import REFERENCE_BACKEND, Registration, register
from gufo.options import KernelOptions

DEFAULT_OPTIONS = KernelOptions()

# the kernels that need no options, of every backend (the torch fallbacks of "cuda" among them)
TABLES = (
    attention.KERNELS,
    causal_conv.KERNELS,
    cpu_int8.KERNELS,
    decode.KERNELS,
    delta_rule.KERNELS,
    linear_reference.KERNELS,
    norm.KERNELS,
    pointwise.KERNELS,
    routing.KERNELS,
)


def registrations(backend: str, options: KernelOptions) -> Iterator[Registration]:
    """The entries of the reference backend and of `backend`."""
    for table in TABLES:
        yield from (entry for entry in table if entry.backend in (REFERENCE_BACKEND, backend))
    if backend == "cuda":
        from gufo.kernels import triton  # imported here: it needs the `triton` package to register

        if triton.AVAILABLE:
            from gufo.kernels.triton import catalog as triton_catalog

            yield from triton_catalog.registrations(options)


def register_all(backend: str, options: KernelOptions = DEFAULT_OPTIONS) -> None:
    """Register the torch reference kernels and those of `backend` ("torch", "cpu" or "cuda")."""
    for entry in registrations(backend, options):
        register(entry)

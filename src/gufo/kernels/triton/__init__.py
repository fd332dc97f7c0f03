"""Triton kernels for GPUs (CUDA and ROCm from one source), for backend "cuda" (`catalog`).

Importing this package never fails: without the `triton` package `AVAILABLE` is False and the
registry falls back to the torch reference.
"""

from __future__ import annotations

try:
    import triton  # noqa: F401
except ImportError:
    AVAILABLE = False
else:
    AVAILABLE = True

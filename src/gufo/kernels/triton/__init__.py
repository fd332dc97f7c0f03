"""Triton kernels for GPUs (CUDA and ROCm from one source), registered under backend "cuda".

Importing this package never fails: without the `triton` package nothing is registered,
`AVAILABLE` is False, and the registry falls back to the torch reference.
"""

from __future__ import annotations

try:
    import triton  # noqa: F401
except ImportError:
    AVAILABLE = False
else:
    AVAILABLE = True
    # importing registers "attention_decode", "linear", "rms_norm", "rope", "gated_act"
    from gufo.kernels.triton import attention, elementwise, gemv  # noqa: F401

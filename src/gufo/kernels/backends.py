"""Map a user-facing device (`cpu`, `cuda`, `cuda:1`, ...) to a kernel backend name in the registry."""

from __future__ import annotations

import torch

from gufo.errors import BadInputError
from gufo.kernels.catalog import DEFAULT_OPTIONS, register_all
from gufo.options import KernelOptions


def select(device: str, options: KernelOptions = DEFAULT_OPTIONS) -> str:
    """Check the device, make it current (GPU kernels allocate on the current device) and register its
    backend's kernels, built with `options`; the backend's name."""
    kind = device.split(":", 1)[0]
    if kind == "cpu":
        register_all("cpu", options)
        return "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(f"--device {device}: no CUDA/ROCm device is visible to torch")
        from gufo.kernels import triton as triton_kernels

        if not triton_kernels.AVAILABLE:
            raise BadInputError(f"--device {device}: the `triton` package is not installed")
        try:
            index = torch.device(device).index
            if index is not None:
                torch.cuda.set_device(index)
        except (RuntimeError, ValueError) as err:
            raise BadInputError(f"--device {device}: {err}") from None
        register_all("cuda", options)
        return "cuda"
    raise BadInputError(f"--device {device}: unknown device (expected cpu or cuda[:N])")


def device_of(backend: str) -> torch.device:
    """Where a backend's tensors live: the current GPU for "cuda", else the CPU."""
    if backend == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cache_dtype(backend: str) -> torch.dtype:
    """KV cache element type: float16 on GPUs (llama.cpp's default; halves the attention reads that
    bound decode at depth), float32 on the CPU (what the fused CPU decode layer reads)."""
    return torch.float16 if backend == "cuda" else torch.float32

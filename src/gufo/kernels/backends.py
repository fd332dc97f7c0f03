"""Map a user-facing device (`cpu`, `cuda`, `cuda:1`, ...) to a kernel backend name in the registry."""

from __future__ import annotations

import torch

from gufo.errors import BadInputError

# Importing these modules registers their kernels.
from gufo.kernels import cpu_int8, decode, linear_reference, norm  # noqa: F401


def select(device: str) -> str:
    kind = device.split(":", 1)[0]
    if kind == "cpu":
        return "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError(f"--device {device}: no CUDA/ROCm device is visible to torch")
        raise BadInputError(f"--device {device}: the GPU backend is not built yet; use --device cpu")
    raise BadInputError(f"--device {device}: unknown device (expected cpu or cuda[:N])")

"""Argument checks of the Triton launchers, run before any launch: a mismatch is a clear error naming it,
never a kernel reading out of bounds."""

from __future__ import annotations

from collections.abc import Collection

import torch


def check_dtype(what: str, tensor: torch.Tensor, dtypes: Collection[torch.dtype]) -> None:
    if tensor.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(
            f"{what}: dtype {str(tensor.dtype).removeprefix('torch.')}, expected one of {allowed}"
        )


def check_device(what: str, tensor: torch.Tensor, device: torch.device) -> None:
    if tensor.device != device:
        raise ValueError(f"{what} is on {tensor.device}, expected {device}")


def check_dims(what: str, tensor: torch.Tensor, dims: int) -> None:
    if tensor.dim() != dims:
        raise ValueError(f"{what}: {dims} dimensions expected, got shape {tuple(tensor.shape)}")


def check_size(what: str, size: int, expected: int) -> None:
    if size != expected:
        raise ValueError(f"{what}: {size}, expected {expected}")

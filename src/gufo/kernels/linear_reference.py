"""Torch reference for the quantized linear op: dequantize once, multiply in float32."""

from __future__ import annotations

import torch

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.registry import REFERENCE_BACKEND, register
from gufo.quant import dequantize


def dequantize_tensor(info: TensorInfo, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 values of a 2-D GGUF tensor (or of the selected rows only)."""
    raw = info.data.reshape(-1, info.data.shape[-1])
    if rows is not None:
        raw = raw[rows.numpy()]
    return dequantize(info.qtype, raw, info.shape[-1])


@register(REFERENCE_BACKEND, "linear")
class ReferenceLinear:
    """y = x @ W^T with W dequantized to float32 at load."""

    name = "torch-dequant-f32"

    @staticmethod
    def prepare(info: TensorInfo) -> torch.Tensor:
        return dequantize_tensor(info)

    @staticmethod
    def apply(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight.T

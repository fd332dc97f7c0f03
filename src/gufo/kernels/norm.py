"""RMSNorm: torch reference and the CPU kernel (one C call instead of a handful of torch ops)."""

from __future__ import annotations

import torch

from gufo.kernels.cpu_int8 import library
from gufo.kernels.registry import REFERENCE_BACKEND, register


@register(REFERENCE_BACKEND, "rms_norm")
class ReferenceRmsNorm:
    name = "torch-rms-norm"

    @staticmethod
    def apply(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@register("cpu", "rms_norm")
class CpuRmsNorm:
    name = "cpu-rms-norm-avx2"

    @staticmethod
    def available() -> bool:
        return library() is not None

    @staticmethod
    def apply(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        k = x.shape[-1]
        library().gufo_rms_norm(x.numel() // k, k, x.data_ptr(), weight.data_ptr(), eps, y.data_ptr())
        return y

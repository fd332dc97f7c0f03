"""RMSNorm: torch reference and the CPU kernel (one C call instead of a handful of torch ops); the
references of the fused ops a backend may offer: residual add + RMSNorm, and RMSNorm + RoPE (QK norm)."""

from __future__ import annotations

import torch

from gufo.kernels.cpu_int8 import library
from gufo.kernels.pointwise import ReferenceRope
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


@register(REFERENCE_BACKEND, "add_rms_norm")
class ReferenceAddRmsNorm:
    """(x + h, RMSNorm(x + h)): the residual add before a pre-norm, as one op."""

    name = "torch-add-rms-norm"

    @staticmethod
    def apply(
        x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        total = x + h
        return total, ReferenceRmsNorm.apply(total, weight, eps)


@register(REFERENCE_BACKEND, "rms_norm_rope")
class ReferenceRmsNormRope:
    """Per-head RMSNorm then rotary embedding (the QK norm of qwen3 and gemma3), as one op."""

    name = "torch-rms-norm-rope"

    @staticmethod
    def apply(
        x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, neox: bool
    ) -> torch.Tensor:
        """x [T, heads, head_dim]; weight [head_dim]; cos/sin as `ReferenceRope` takes them."""
        return ReferenceRope.apply(ReferenceRmsNorm.apply(x, weight, eps), cos, sin, neox)

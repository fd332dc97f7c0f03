"""RMSNorm: torch reference and the CPU kernel (one C call instead of a handful of torch ops); the
references of the fused ops a backend may offer: residual add + RMSNorm, RMSNorm gated by silu(z),
RMSNorm + RoPE (QK norm), and a decode step's heads written into the KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gufo.kernels.contracts import (
    ADD_RMS_NORM,
    ATTENTION_HEADS,
    GATED_RMS_NORM,
    RMS_NORM,
    RMS_NORM_ROPE,
    AddRmsNormKernel,
    AttentionHeadsKernel,
    GatedRmsNormKernel,
    RmsNormKernel,
    RmsNormRopeKernel,
)
from gufo.kernels.cpu_int8 import library
from gufo.kernels.int8_rows import Int8Rows, as_int8_rows
from gufo.kernels.kv_pages import KVPages
from gufo.kernels.pointwise import ReferenceRope
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


class ReferenceRmsNorm(RmsNormKernel):
    name = "torch-rms-norm"

    @staticmethod
    def apply(
        x: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> torch.Tensor | Int8Rows:
        """The norm of x's rows; `int8`: as `Int8Rows` (what a backend's int8 products take)."""
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
        return as_int8_rows(normed) if int8 else normed


class CpuRmsNorm(RmsNormKernel):
    name = "cpu-rms-norm-avx2"

    @staticmethod
    def available() -> bool:
        return library() is not None

    @staticmethod
    def apply(
        x: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> torch.Tensor | Int8Rows:
        x = x.contiguous()
        y = torch.empty_like(x)
        k = x.shape[-1]
        library().gufo_rms_norm(x.numel() // k, k, x.data_ptr(), weight.data_ptr(), eps, y.data_ptr())
        return as_int8_rows(y) if int8 else y


class ReferenceAddRmsNorm(AddRmsNormKernel):
    """(x + h, RMSNorm(x + h)): the residual add before a pre-norm, as one op."""

    name = "torch-add-rms-norm"

    @staticmethod
    def apply(
        x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | Int8Rows]:
        total = x + h
        return total, ReferenceRmsNorm.apply(total, weight, eps, int8)


class ReferenceGatedRmsNorm(GatedRmsNormKernel):
    """RMSNorm(x) * silu(z): the Gated DeltaNet's output gate, as one op."""

    name = "torch-gated-rms-norm"

    @staticmethod
    def apply(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return ReferenceRmsNorm.apply(x, weight, eps) * F.silu(z)


class ReferenceRmsNormRope(RmsNormRopeKernel):
    """Per-head RMSNorm then rotary embedding (the QK norm of qwen3 and gemma3), as one op."""

    name = "torch-rms-norm-rope"

    @staticmethod
    def apply(
        x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, neox: bool
    ) -> torch.Tensor:
        """x [T, heads, head_dim]; weight [head_dim]; cos/sin as `ReferenceRope` takes them."""
        return ReferenceRope.apply(ReferenceRmsNorm.apply(x, weight, eps), cos, sin, neox)


class ReferenceAttentionHeads(AttentionHeadsKernel):
    """A decode step's projected heads: q and k normed (QK norm, when weights are given) and rotated;
    k and v written into the cache at the tokens' positions; returns q."""

    name = "torch-attention-heads"

    @staticmethod
    def apply(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_weight: torch.Tensor | None,
        k_weight: torch.Tensor | None,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        neox: bool,
        pages: KVPages,
        index: torch.Tensor,
        slots: torch.Tensor | int,
    ) -> torch.Tensor:
        """q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv]; k and v written into the cache pages (any dtype)
        at positions index ([T] int64) of slot slots[t] (or the one slot given); cos/sin as
        `ReferenceRope` takes them."""

        def rotate(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
            normed = x if weight is None else ReferenceRmsNorm.apply(x, weight, eps)
            return ReferenceRope.apply(normed, cos, sin, neox)

        pages.write(index, rotate(k, k_weight), v, slots)
        return rotate(q, q_weight)


KERNELS = (
    Registration(REFERENCE_BACKEND, RMS_NORM, ReferenceRmsNorm()),
    Registration("cpu", RMS_NORM, CpuRmsNorm()),
    Registration(REFERENCE_BACKEND, ADD_RMS_NORM, ReferenceAddRmsNorm()),
    Registration(REFERENCE_BACKEND, GATED_RMS_NORM, ReferenceGatedRmsNorm()),
    Registration(REFERENCE_BACKEND, RMS_NORM_ROPE, ReferenceRmsNormRope()),
    Registration(REFERENCE_BACKEND, ATTENTION_HEADS, ReferenceAttentionHeads()),
)

"""Torch references of the pointwise ops of a layer: rotary embedding ("rope") and the gated
activation ("gated_act": SwiGLU / GeGLU). GPU kernels: `gufo.kernels.triton.elementwise`."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from gufo.kernels.contracts import GATED_ACT, ROPE, GatedActKernel, RopeKernel
from gufo.kernels.int8_rows import Int8Rows, as_int8_rows
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Gated-FFN activations by name (the fused decode kernels implement the same names).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu_tanh": gelu_tanh}


def rotated(x: torch.Tensor, neox: bool) -> torch.Tensor:
    """The partner of each column: (x2, x1) halves for NeoX, swapped adjacent pairs otherwise."""
    if neox:
        half = x.shape[-1] // 2
        return torch.cat((x[..., half:], x[..., :half]), -1)
    return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)


class ReferenceRope(RopeKernel):
    name = "torch-rope"

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos/sin [T, rotated dims] (signed sines, laid out as `rotated`)."""
        cos, sin = cos[:, None, :], sin[:, None, :]
        dim = cos.shape[-1]
        if dim == x.shape[-1]:
            return x * cos + rotated(x, neox) * sin
        rot, rest = x[..., :dim], x[..., dim:]
        return torch.cat((rot * cos + rotated(rot, neox) * sin, rest), -1)


class ReferenceGatedAct(GatedActKernel):
    name = "torch-gated-act"

    @staticmethod
    def apply(gate: torch.Tensor, up: torch.Tensor, act: str, int8: bool = False) -> torch.Tensor | Int8Rows:
        """act(gate) * up; `int8`: as `Int8Rows` (what a backend's int8 products take)."""
        out = ACTIVATIONS[act](gate) * up
        return as_int8_rows(out) if int8 else out


KERNELS = (
    Registration(REFERENCE_BACKEND, ROPE, ReferenceRope()),
    Registration(REFERENCE_BACKEND, GATED_ACT, ReferenceGatedAct()),
)

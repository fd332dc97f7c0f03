"""Fused row-wise kernels of a layer: RMSNorm (alone, after a residual add, or before a rotary
embedding: the QK norm), rotary embedding, gated activation (SwiGLU / GeGLU).

Each replaces several torch kernels (a norm is square, mean, rsqrt and two multiplies; RoPE with
tables is a concatenation and three elementwise passes; the gated activation two) with one pass that
reads and writes each element once, in float32. At decode these kernels are tiny and their count is
what costs; at prefill they are memory-bound passes over [tokens, width] activations. Each is
registered on the "cuda" backend beside its torch reference (`gufo.kernels.norm`,
`gufo.kernels.pointwise`), which is its test oracle.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from gufo.kernels.registry import register

NUM_WARPS = 4
ACTIVATION_BLOCK = 1024  # elements per program of the gated activation


@triton.jit
def _inverse_rms(x, n, eps):
    """1 / sqrt(mean(x^2) + eps) over the n valid values of x (the rest loaded as 0): one definition,
    so the fused norms round exactly as `rms_norm_rows`."""
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)


@triton.jit
def rms_norm_rows(x_ptr, w_ptr, out_ptr, K, stride_x, eps, BLOCK_K: tl.constexpr):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one program per row."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
    inv = _inverse_rms(x, K, eps)
    w = tl.load(w_ptr + k, mask=k < K, other=0.0)
    tl.store(out_ptr + row * K + k, x * inv * w, mask=k < K)


@triton.jit
def add_rms_norm_rows(
    x_ptr, h_ptr, w_ptr, sum_ptr, out_ptr, K, stride_x, stride_h, eps, BLOCK_K: tl.constexpr
):  # fmt: skip
    """sum[r] = x[r] + h[r] and out[r] = RMSNorm(sum[r]) * w, one program per row (the same arithmetic
    as an add followed by `rms_norm_rows`)."""
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
    x += tl.load(h_ptr + row * stride_h + k, mask=k < K, other=0.0).to(tl.float32)
    tl.store(sum_ptr + row * K + k, x, mask=k < K)
    inv = _inverse_rms(x, K, eps)
    w = tl.load(w_ptr + k, mask=k < K, other=0.0)
    tl.store(out_ptr + row * K + k, x * inv * w, mask=k < K)


@triton.jit
def _partner(i, ROT, NEOX: tl.constexpr):
    """The column each rotated column pairs with: the other half (NeoX) or the adjacent one."""
    if NEOX:
        half = ROT // 2
        return tl.where(i < half, i + half, i - half)
    return i ^ 1


@triton.jit
def rms_norm_rope_rows(
    x_ptr, cos_ptr, sin_ptr, out_ptr, heads, D, ROT, stride_xt, stride_xh, stride_c, w_ptr, eps,
    NEOX: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program per (token, head): the head's RMSNorm with weight w, then `rope_rows`' rotation of
    the normalised values, without writing them in between."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    i = tl.arange(0, BLOCK_D)
    base = x_ptr + token * stride_xt + head * stride_xh
    x = tl.load(base + i, mask=i < D, other=0.0)
    inv = _inverse_rms(x, D, eps)
    partner = _partner(i, ROT, NEOX)
    rotating = i < ROT
    x = x * inv * tl.load(w_ptr + i, mask=i < D, other=0.0)
    x_partner = tl.load(base + partner, mask=rotating, other=0.0) * inv
    x_partner = x_partner * tl.load(w_ptr + partner, mask=rotating, other=0.0)
    cos = tl.load(cos_ptr + token * stride_c + i, mask=rotating, other=1.0)
    sin = tl.load(sin_ptr + token * stride_c + i, mask=rotating, other=0.0)
    out = out_ptr + (token * heads + head) * D + i
    tl.store(out, x * cos + x_partner * sin, mask=i < D)


@triton.jit
def rope_rows(
    x_ptr, cos_ptr, sin_ptr, out_ptr, heads, D, ROT, stride_xt, stride_xh, stride_c,
    NEOX: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program per (token, head): out = x * cos + partner(x) * sin on the first ROT columns (the
    tables hold signed sines in `Rope.rotated`'s layout), the other columns copied."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    i = tl.arange(0, BLOCK_D)
    base = x_ptr + token * stride_xt + head * stride_xh
    x = tl.load(base + i, mask=i < D, other=0.0)
    partner = _partner(i, ROT, NEOX)
    rotating = i < ROT
    x_partner = tl.load(base + partner, mask=rotating, other=0.0)
    cos = tl.load(cos_ptr + token * stride_c + i, mask=rotating, other=1.0)
    sin = tl.load(sin_ptr + token * stride_c + i, mask=rotating, other=0.0)
    out = out_ptr + (token * heads + head) * D + i
    tl.store(out, x * cos + x_partner * sin, mask=i < D)


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def gated_act_rows(
    gate_ptr, up_ptr, out_ptr, F, stride_g, stride_u, GELU: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    """out[r, j] = act(gate[r, j]) * up[r, j]; act is SiLU, or tanh-GELU with GELU."""
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(gate_ptr + row * stride_g + j, mask=j < F, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + j, mask=j < F, other=0.0).to(tl.float32)
    act = _gelu_tanh(g) if GELU else g / (1.0 + tl.exp(-g))
    tl.store(out_ptr + row * F + j, act * u, mask=j < F)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with unit stride along the last dim (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


@register("cuda", "rms_norm")
class TritonRmsNorm:
    name = "triton-rms-norm"

    @staticmethod
    def apply(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = _rows(x)
        out = torch.empty(x2.shape, dtype=torch.float32, device=x.device)
        if x2.shape[0]:
            k = x2.shape[1]
            rms_norm_rows[(x2.shape[0],)](
                x2, weight, out, k, x2.stride(0), eps, BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS
            )
        return out.reshape(x.shape)


@register("cuda", "add_rms_norm")
class TritonAddRmsNorm:
    name = "triton-add-rms-norm"

    @staticmethod
    def apply(
        x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x2, h2 = _rows(x), _rows(h)
        total = torch.empty(x2.shape, dtype=torch.float32, device=x.device)
        out = torch.empty_like(total)
        if x2.shape[0]:
            k = x2.shape[1]
            add_rms_norm_rows[(x2.shape[0],)](
                x2, h2, weight, total, out, k, x2.stride(0), h2.stride(0), eps,
                BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS,
            )  # fmt: skip
        return total.reshape(x.shape), out.reshape(x.shape)


def _per_head(
    kernel: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool, *extra: Any
) -> torch.Tensor:
    """Launch a one-program-per-(token, head) rotary kernel on x [T, heads, D]; `extra` arguments
    follow the strides."""
    tokens, heads, dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(tokens, heads, dim, dtype=torch.float32, device=x.device)
    if tokens:
        kernel[(tokens, heads)](
            x, cos, sin, out, heads, dim, cos.shape[-1], x.stride(0), x.stride(1), cos.stride(0), *extra,
            NEOX=neox, BLOCK_D=triton.next_power_of_2(dim), num_warps=1,
        )  # fmt: skip
    return out


@register("cuda", "rms_norm_rope")
class TritonRmsNormRope:
    name = "triton-rms-norm-rope"

    @staticmethod
    def apply(
        x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, neox: bool
    ) -> torch.Tensor:
        """x [T, heads, D] (float32); weight [D]; cos/sin [T, rotated dims] from `Rope.tables`."""
        return _per_head(rms_norm_rope_rows, x, cos, sin, neox, weight, eps)


@register("cuda", "rope")
class TritonRope:
    name = "triton-rope"

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
        """x [T, heads, D] (float32); cos/sin [T, rotated dims] from `Rope.tables`."""
        return _per_head(rope_rows, x, cos, sin, neox)


@register("cuda", "gated_act")
class TritonGatedAct:
    name = "triton-gated-act"

    @staticmethod
    def apply(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
        g2, u2 = _rows(gate), _rows(up)
        rows, width = g2.shape
        out = torch.empty(rows, width, dtype=torch.float32, device=gate.device)
        if rows:
            gated_act_rows[(rows, triton.cdiv(width, ACTIVATION_BLOCK))](
                g2, u2, out, width, g2.stride(0), u2.stride(0),
                GELU=act == "gelu_tanh", BLOCK=ACTIVATION_BLOCK, num_warps=NUM_WARPS,
            )  # fmt: skip
        return out.reshape(gate.shape)


# Widths of real models: Qwen3-0.6B (hidden 1024, FFN 3072, heads 16 x 128 on 8 KV heads, NeoX RoPE),
# SmolLM2-135M (hidden 576, heads 64 wide, adjacent-pair RoPE) and gemma3-270m (hidden 640, GeGLU).
REFERENCE_NORM_WIDTHS = (1024, 576, 640, 128, 64, 256)
REFERENCE_ROPE = ((16, 128, True), (9, 64, False), (4, 256, True))
REFERENCE_FFN = ((3072, "silu"), (2048, "gelu_tanh"))


def launch_examples():
    """For `gufo kernels own` (gufo.kernels.triton.offline, which intercepts the launches): the norms,
    rotary embeddings and gated activations of the reference models, as meta tensors."""
    yield "float32"
    for width in REFERENCE_NORM_WIDTHS:
        row, weight = torch.empty(1, width, device="meta"), torch.empty(width, device="meta")
        TritonRmsNorm.apply(row, weight, 1e-6)
        TritonAddRmsNorm.apply(row, row, weight, 1e-6)
    for heads, dim, neox in REFERENCE_ROPE:
        tables = torch.empty(1, dim, device="meta")
        TritonRope.apply(torch.empty(1, heads, dim, device="meta"), tables, tables, neox)
        heads_in = torch.empty(1, heads, dim, device="meta")
        TritonRmsNormRope.apply(heads_in, torch.empty(dim, device="meta"), 1e-6, tables, tables, neox)
    for width, act in REFERENCE_FFN:
        TritonGatedAct.apply(torch.empty(1, width, device="meta"), torch.empty(1, width, device="meta"), act)

"""Fused row-wise kernels of a layer: RMSNorm (alone, after a residual add, gated by silu(z), or before
a rotary embedding: the QK norm), rotary embedding, gated activation (SwiGLU / GeGLU).

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

from gufo.kernels.contracts import (
    ADD_RMS_NORM,
    ATTENTION_HEADS,
    GATED_ACT,
    GATED_RMS_NORM,
    RMS_NORM,
    RMS_NORM_ROPE,
    ROPE,
    AddRmsNormKernel,
    AttentionHeadsKernel,
    GatedActKernel,
    GatedRmsNormKernel,
    RmsNormKernel,
    RmsNormRopeKernel,
    RopeKernel,
)
from gufo.kernels.int8_rows import Int8Rows, row_outputs
from gufo.kernels.kv_pages import KVPages
from gufo.kernels.registry import Registration
from gufo.kernels.triton.checks import check_device, check_size
from gufo.kernels.triton.dependent_launch import DependentLaunch, LaunchedKernel, wait_for_inputs
from gufo.kernels.triton.jit_helpers import store_int8_row

NUM_WARPS = 4
ACTIVATION_BLOCK = 1024  # elements per program of the gated activation


@triton.jit
def _inverse_rms(x, n, eps):
    """1 / sqrt(mean(x^2) + eps) over the n valid values of x (the rest loaded as 0): one definition,
    so the fused norms round exactly as `rms_norm_rows`."""
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)


@triton.jit
def _store_row(
    y, row, first, F, out_ptr, xq_ptr, xd_ptr, xs_ptr, INT8: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    """Store y ([BLOCK] float32: columns first.. of a row of F, `first` a multiple of BLOCK) as float32
    into out [rows, F], or with INT8 as `Int8Rows` (F a multiple of 32)."""
    if INT8:
        store_int8_row(y, row, first, F, xq_ptr, xd_ptr, xs_ptr, BLOCK)
    else:
        j = first + tl.arange(0, BLOCK)
        tl.store(out_ptr + row * F + j, y, mask=j < F)


@triton.jit
def rms_norm_rows(
    x_ptr, w_ptr, out_ptr, xq_ptr, xd_ptr, xs_ptr, K, stride_x, eps,
    INT8: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, one program per row (INT8: as `Int8Rows`)."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
    inv = _inverse_rms(x, K, eps)
    w = tl.load(w_ptr + k, mask=k < K, other=0.0)
    _store_row(x * inv * w, row, 0, K, out_ptr, xq_ptr, xd_ptr, xs_ptr, INT8, BLOCK_K)


@triton.jit
def add_rms_norm_rows(
    x_ptr, h_ptr, w_ptr, sum_ptr, out_ptr, xq_ptr, xd_ptr, xs_ptr, K, stride_x, stride_h, eps,
    INT8: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """sum[r] = x[r] + h[r] and out[r] = RMSNorm(sum[r]) * w, one program per row (the same arithmetic
    as an add followed by `rms_norm_rows`; INT8: out as `Int8Rows`)."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
    x += tl.load(h_ptr + row * stride_h + k, mask=k < K, other=0.0).to(tl.float32)
    tl.store(sum_ptr + row * K + k, x, mask=k < K)
    inv = _inverse_rms(x, K, eps)
    w = tl.load(w_ptr + k, mask=k < K, other=0.0)
    _store_row(x * inv * w, row, 0, K, out_ptr, xq_ptr, xd_ptr, xs_ptr, INT8, BLOCK_K)


@triton.jit
def gated_rms_norm_rows(
    x_ptr, z_ptr, w_ptr, out_ptr, H, K, stride_xt, stride_xh, stride_zt, stride_zh, eps,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[t, h] = RMSNorm(x[t, h]) * w * silu(z[t, h]), one program per (token, head)."""
    wait_for_inputs(PDL)
    token, head = tl.program_id(0).to(tl.int64), tl.program_id(1)
    k = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + token * stride_xt + head * stride_xh + k, mask=k < K, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + token * stride_zt + head * stride_zh + k, mask=k < K, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + k, mask=k < K, other=0.0)
    tl.store(
        out_ptr + (token * H + head) * K + k,
        x * _inverse_rms(x, K, eps) * w * (z / (1.0 + tl.exp(-z))),
        mask=k < K,
    )


@triton.jit
def _partner(i, ROT, NEOX: tl.constexpr):
    """The column each rotated column pairs with: the other half (NeoX) or the adjacent one."""
    if NEOX:
        half = ROT // 2
        return tl.where(i < half, i + half, i - half)
    return i ^ 1


@triton.jit
def _rotated_head(
    base, cos_row, sin_row, w_ptr, eps, D, ROT,
    NORM: tl.constexpr, NEOX: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One head's D values at `base`, RMSNorm'ed with weight w (NORM), then rotated on the first ROT
    columns: x * cos + partner(x) * sin (the tables hold signed sines in `Rope.rotated`'s layout). The
    one definition of the rotary kernels' arithmetic."""
    i = tl.arange(0, BLOCK_D)
    x = tl.load(base + i, mask=i < D, other=0.0).to(tl.float32)
    partner = _partner(i, ROT, NEOX)
    rotating = i < ROT
    x_partner = tl.load(base + partner, mask=rotating, other=0.0).to(tl.float32)
    if NORM:
        inv = _inverse_rms(x, D, eps)
        x = x * inv * tl.load(w_ptr + i, mask=i < D, other=0.0)
        x_partner = x_partner * inv
        x_partner = x_partner * tl.load(w_ptr + partner, mask=rotating, other=0.0)
    cos = tl.load(cos_row + i, mask=rotating, other=1.0)
    sin = tl.load(sin_row + i, mask=rotating, other=0.0)
    return x * cos + x_partner * sin


@triton.jit
def rms_norm_rope_rows(
    x_ptr, cos_ptr, sin_ptr, out_ptr, heads, D, ROT, stride_xt, stride_xh, stride_c, w_ptr, eps,
    NEOX: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (token, head): the head's RMSNorm with weight w, then `rope_rows`' rotation of
    the normalised values, without writing them in between."""
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    base = x_ptr + token * stride_xt + head * stride_xh
    rows = token * stride_c
    out = _rotated_head(base, cos_ptr + rows, sin_ptr + rows, w_ptr, eps, D, ROT, True, NEOX, BLOCK_D)
    i = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + (token * heads + head) * D + i, out, mask=i < D)


@triton.jit
def rope_rows(
    x_ptr, cos_ptr, sin_ptr, out_ptr, heads, D, ROT, stride_xt, stride_xh, stride_c,
    NEOX: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (token, head): out = x * cos + partner(x) * sin on the first ROT columns, the
    other columns copied."""
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    base = x_ptr + token * stride_xt + head * stride_xh
    rows = token * stride_c
    out = _rotated_head(base, cos_ptr + rows, sin_ptr + rows, x_ptr, 0.0, D, ROT, False, NEOX, BLOCK_D)
    i = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + (token * heads + head) * D + i, out, mask=i < D)


@triton.jit
def attention_heads_to_cache(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, index_ptr, slot_ptr, table_ptr, out_ptr,
    keys_ptr, values_ptr, H, HKV, D, DV, ROT, stride_qt, stride_kt, stride_vt, stride_c, stride_table,
    stride_kh, stride_kp, stride_kc, stride_vh, stride_vp, stride_vc, eps, PAGE: tl.constexpr,
    NORM: tl.constexpr, NEOX: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """One program per (token, head of q, k or v), for a decode step: q heads normed (NORM) and rotated
    into out [T, H, D]; k heads normed and rotated, v heads as they are, into the cache pages at the
    token's position (index) of its slot (slot_ptr; table stride 0: one slot's table row), in the
    cache's dtype. Replaces two rotary launches and the cache writes."""
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    rows = token * stride_c
    position = tl.load(index_ptr + token)
    slot = tl.load(slot_ptr + token)
    page = tl.load(table_ptr + slot * stride_table + position // PAGE)
    keys_ptr += page * stride_kp
    values_ptr += page * stride_vp
    position = position % PAGE
    i = tl.arange(0, BLOCK_D)
    if head < H:
        base = q_ptr + token * stride_qt + head * D
        out = _rotated_head(base, cos_ptr + rows, sin_ptr + rows, qw_ptr, eps, D, ROT, NORM, NEOX, BLOCK_D)
        tl.store(out_ptr + (token * H + head) * D + i, out, mask=i < D)
    elif head < H + HKV:
        kv_head = head - H
        base = k_ptr + token * stride_kt + kv_head * D
        out = _rotated_head(base, cos_ptr + rows, sin_ptr + rows, kw_ptr, eps, D, ROT, NORM, NEOX, BLOCK_D)
        row = keys_ptr + kv_head * stride_kh + position * stride_kc
        tl.store(row + i, out.to(keys_ptr.dtype.element_ty), mask=i < D)
    else:
        kv_head = head - H - HKV
        j = tl.arange(0, BLOCK_DV)
        value = tl.load(v_ptr + token * stride_vt + kv_head * DV + j, mask=j < DV, other=0.0)
        row = values_ptr + kv_head * stride_vh + position * stride_vc
        tl.store(row + j, value.to(values_ptr.dtype.element_ty), mask=j < DV)


@triton.jit
def _gelu_tanh(x):
    # 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x / (1.0 + tl.exp(-2.0 * u))


@triton.jit
def gated_act_rows(
    gate_ptr, up_ptr, out_ptr, xq_ptr, xd_ptr, xs_ptr, F, stride_g, stride_u,
    GELU: tl.constexpr, INT8: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[r, j] = act(gate[r, j]) * up[r, j]; act is SiLU, or tanh-GELU with GELU (INT8: out as
    `Int8Rows`)."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    g = tl.load(gate_ptr + row * stride_g + j, mask=j < F, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * stride_u + j, mask=j < F, other=0.0).to(tl.float32)
    act = _gelu_tanh(g) if GELU else g / (1.0 + tl.exp(-g))
    _store_row(act * u, row, tl.program_id(1) * BLOCK, F, out_ptr, xq_ptr, xd_ptr, xs_ptr, INT8, BLOCK)


def _check_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """x [T, heads, D] and its rotary tables [T, rotated dims] as the per-head kernels take them."""
    if x.dim() != 3:
        raise ValueError(f"x: [tokens, heads, head_dim] expected, got shape {tuple(x.shape)}")
    for what, table in (("cos", cos), ("sin", sin)):
        check_device(what, table, x.device)
        check_size(f"{what} table rows (one per token)", table.shape[0], x.shape[0])
        if table.shape[-1] > x.shape[-1]:
            raise ValueError(f"{what} table: {table.shape[-1]} rotated dims for heads {x.shape[-1]} wide")


def _check_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    check_device("norm weight", weight, x.device)
    check_size("norm weight width", weight.numel(), x.shape[-1])


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with unit stride along the last dim (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


# Row kernels that may quantize compile without fused multiply-adds (store_int8_blocks): the plain and
# the quantizing variant then round alike, and both alike the separate quantizer.
EXACT = {"enable_fp_fusion": False}


class TritonRmsNorm(LaunchedKernel, RmsNormKernel):
    name = "triton-rms-norm"

    def apply(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> torch.Tensor | Int8Rows:
        _check_weight(x, weight)
        x2 = _rows(x)
        out, pointers = row_outputs(*x2.shape, x.device, int8)
        if x2.shape[0]:
            k = x2.shape[1]
            rms_norm_rows[(x2.shape[0],)](
                x2, weight, *pointers, k, x2.stride(0), eps,
                INT8=int8, BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS, **EXACT,
                **self.launch.options(x.device),
            )  # fmt: skip
        return out if int8 else out.reshape(x.shape)


class TritonAddRmsNorm(LaunchedKernel, AddRmsNormKernel):
    name = "triton-add-rms-norm"

    def apply(
        self, x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | Int8Rows]:
        _check_weight(x, weight)
        if h.shape != x.shape:
            raise ValueError(f"residual add: h has shape {tuple(h.shape)}, x {tuple(x.shape)}")
        check_device("h", h, x.device)
        x2, h2 = _rows(x), _rows(h)
        total = torch.empty(x2.shape, dtype=torch.float32, device=x.device)
        out, pointers = row_outputs(*x2.shape, x.device, int8)
        if x2.shape[0]:
            k = x2.shape[1]
            add_rms_norm_rows[(x2.shape[0],)](
                x2, h2, weight, total, *pointers, k, x2.stride(0), h2.stride(0), eps,
                INT8=int8, BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS, **EXACT,
                **self.launch.options(x.device),
            )  # fmt: skip
        return total.reshape(x.shape), out if int8 else out.reshape(x.shape)


class TritonGatedRmsNorm(LaunchedKernel, GatedRmsNormKernel):
    name = "triton-gated-rms-norm"

    def apply(self, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        _check_weight(x, weight)
        if x.dim() != 3 or z.shape != x.shape:
            raise ValueError(f"gated norm: x {tuple(x.shape)} and z {tuple(z.shape)} must be one [T, H, D]")
        check_device("z", z, x.device)
        x, z = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, z))
        tokens, heads, width = x.shape
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        if x.numel():
            gated_rms_norm_rows[(tokens, heads)](
                x, z, weight, out, heads, width, x.stride(0), x.stride(1), z.stride(0), z.stride(1), eps,
                BLOCK_K=triton.next_power_of_2(width), num_warps=NUM_WARPS, **EXACT,
                **self.launch.options(x.device),
            )  # fmt: skip
        return out


def _per_head(
    launch: DependentLaunch,
    kernel: Any,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    neox: bool,
    *extra: Any,
) -> torch.Tensor:
    """Launch a one-program-per-(token, head) rotary kernel on x [T, heads, D]; `extra` arguments
    follow the strides."""
    _check_tables(x, cos, sin)
    tokens, heads, dim = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    out = torch.empty(tokens, heads, dim, dtype=torch.float32, device=x.device)
    if tokens:
        kernel[(tokens, heads)](
            x, cos, sin, out, heads, dim, cos.shape[-1], x.stride(0), x.stride(1), cos.stride(0), *extra,
            NEOX=neox, BLOCK_D=triton.next_power_of_2(dim), num_warps=1,
            **launch.options(x.device),
        )  # fmt: skip
    return out


class TritonRmsNormRope(LaunchedKernel, RmsNormRopeKernel):
    name = "triton-rms-norm-rope"

    def apply(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        neox: bool,
    ) -> torch.Tensor:
        """x [T, heads, D] (float32); weight [D]; cos/sin [T, rotated dims] from `Rope.tables`."""
        return _per_head(self.launch, rms_norm_rope_rows, x, cos, sin, neox, weight, eps)


class TritonRope(LaunchedKernel, RopeKernel):
    name = "triton-rope"

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
        """x [T, heads, D] (float32); cos/sin [T, rotated dims] from `Rope.tables`."""
        return _per_head(self.launch, rope_rows, x, cos, sin, neox)


class TritonAttentionHeads(LaunchedKernel, AttentionHeadsKernel):
    name = "triton-attention-heads"

    def apply(
        self,
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
        """The reference's contract (`gufo.kernels.norm.ReferenceAttentionHeads`) in one launch."""
        if isinstance(slots, torch.Tensor):
            check_size("slots entries (one per token)", slots.numel(), q.shape[0])
        table, slot_of, table_stride = pages.launch_rows(index, slots)
        keys, values = pages.keys, pages.values
        tokens, heads, dim = q.shape
        kv_heads, value_dim = v.shape[1], v.shape[2]
        q2, k2, v2 = (_rows(t.reshape(tokens, -1)) for t in (q, k, v))
        cos, sin = cos.contiguous(), sin.contiguous()
        out = torch.empty(tokens, heads, dim, dtype=torch.float32, device=q.device)
        norm = q_weight is not None
        if tokens:
            attention_heads_to_cache[(tokens, heads + 2 * kv_heads)](
                q2, k2, v2, cos, sin, q_weight if norm else q2, k_weight if norm else q2, index, slot_of,
                table, out, keys, values, heads, kv_heads, dim, value_dim, cos.shape[-1], q2.stride(0),
                k2.stride(0), v2.stride(0), cos.stride(0), table_stride, keys.stride(0), keys.stride(1),
                keys.stride(2), values.stride(0), values.stride(1), values.stride(2), eps,
                PAGE=pages.page_size, NORM=norm, NEOX=neox,
                BLOCK_D=triton.next_power_of_2(dim), BLOCK_DV=triton.next_power_of_2(value_dim), num_warps=1,
                **self.launch.options(q.device),
            )  # fmt: skip
        return out


class TritonGatedAct(LaunchedKernel, GatedActKernel):
    name = "triton-gated-act"

    def apply(
        self, gate: torch.Tensor, up: torch.Tensor, act: str, int8: bool = False
    ) -> torch.Tensor | Int8Rows:
        if up.shape != gate.shape:
            raise ValueError(f"gated activation: up has shape {tuple(up.shape)}, gate {tuple(gate.shape)}")
        check_device("up", up, gate.device)
        g2, u2 = _rows(gate), _rows(up)
        rows, width = g2.shape
        out, pointers = row_outputs(rows, width, gate.device, int8)
        if rows:
            gated_act_rows[(rows, triton.cdiv(width, ACTIVATION_BLOCK))](
                g2, u2, *pointers, width, g2.stride(0), u2.stride(0),
                GELU=act == "gelu_tanh", INT8=int8, BLOCK=ACTIVATION_BLOCK, num_warps=NUM_WARPS, **EXACT,
                **self.launch.options(gate.device),
            )  # fmt: skip
        return out if int8 else out.reshape(gate.shape)


def registrations(launch: DependentLaunch) -> tuple[Registration, ...]:
    return (
        Registration("cuda", RMS_NORM, TritonRmsNorm(launch)),
        Registration("cuda", ADD_RMS_NORM, TritonAddRmsNorm(launch)),
        Registration("cuda", GATED_RMS_NORM, TritonGatedRmsNorm(launch)),
        Registration("cuda", RMS_NORM_ROPE, TritonRmsNormRope(launch)),
        Registration("cuda", ROPE, TritonRope(launch)),
        Registration("cuda", ATTENTION_HEADS, TritonAttentionHeads(launch)),
        Registration("cuda", GATED_ACT, TritonGatedAct(launch)),
    )

"""The Triton kernels of the skinny quantized products y = x @ W^T (M = 1..16 activation rows) and of
the prefill's dequantizer, one set per weight format, read from the field planes of `planes`.

Kernels (one per format, named `gemv_<format>` so profiles and resource reports read on their own):
each program owns BLOCK_N output rows and BLOCK_M activation rows and walks K in steps of STEP input
columns (8 blocks of Q4_0/Q4_1/Q5_0, 4 blocks of Q8_0, one 256-element super-block of the K-quants,
128 columns of float weights). Each step loads the packed bytes of its BLOCK_N x STEP tile once,
dequantizes them in registers to float32 exactly as `gufo.formats` does (q * scale (+ offset), K-quant
scales = d * 6-bit scale), and multiplies that tile against all BLOCK_M activation rows, so the weight
traffic (what bounds decode) does not grow with M. Nibble formats are not interleaved back into
element order: the low-nibble and high-nibble halves are each paired with the activation columns they
belong to, which is the same dot product without shuffles.

The product of a dequantized tile with the activations, accumulated in float32:
  - float32 activations, or fewer than DOT_MIN_ROWS rows: broadcast multiply and row sums on the
    vector units (`gemv_<format>`; float32 weights, within float32 rounding of the reference);
  - float16/bfloat16 activations with DOT_MIN_ROWS..16 rows on NVIDIA: `tl.dot` on the tensor cores
    with the tile rounded to the activation dtype (`gemv_<format>_dot`).
`dequant_<format>` writes the whole matrix with the tensor-core kernels' tile code (prefill_gemm); the
codebook formats' own dequantizers are in codebook_dequant.

Split-K: grid axis 1 cuts the K steps into ranges, each writing float32 partials [splits, M, N] that
are summed afterwards (launch.py); deterministic (no atomics), so repeated runs give identical tokens.

No CUDA-only intrinsics or inline asm: the same source compiles for NVIDIA and AMD (wave64 and wave32).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from gufo.kernels.triton.codebook_dequant import (
    dequant_iq2_xxs,
    dequant_iq3_s,
    dequant_iq3_xxs,
    dequant_iq4_nl,
    dequant_iq4_xs,
)
from gufo.kernels.triton.codebook_groups import (
    iq2_xxs_parts,
    iq3_s_parts,
    iq3_xxs_parts,
    iq4_xs_scale,
    super_block,
)
from gufo.kernels.triton.dependent_launch import wait_for_inputs
from gufo.kernels.triton.jit_helpers import add_row, store_partials, vector_program

Q = GGMLQuantizationType

# --------------------------------------------------------------------------------------------------
# shared device helpers


@triton.jit
def _program(M, N, n_steps, steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's output rows n, activation rows m, split index and K-step range [first, last)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    first = split * steps_per_split
    last = tl.minimum(first + steps_per_split, n_steps)
    return n, m, split, first, last


@triton.jit
def _accumulate(acc, x_ptr, stride_xm, m, M, K, k, w):
    """acc [BLOCK_M, BLOCK_N] += x[m, k] @ w^T, with w a dequantized tile whose columns are inputs k.

    w may be 3-D [BLOCK_N, a, b] (blocks x elements); its row-major flattening matches k.
    """
    w = tl.reshape(w, (w.shape[0], k.shape[0]))
    x = tl.load(
        x_ptr + m[:, None] * stride_xm + k[None, :], mask=(m < M)[:, None] & (k < K)[None, :], other=0.0
    )
    return tl.dot(x, tl.trans(w.to(x.dtype)), acc)


@triton.jit
def _consume(acc, x_ptr, stride_xm, m, M, K, k, w, out_ptr, n, N, DEQUANT: tl.constexpr):
    """The products' `_accumulate`, or with DEQUANT the tile itself written to out[n, k] (out's dtype)."""
    if DEQUANT:
        w = tl.reshape(w, (w.shape[0], k.shape[0]))
        at = out_ptr + n.to(tl.int64)[:, None] * K + k[None, :]
        tl.store(at, w.to(out_ptr.dtype.element_ty), mask=(n < N)[:, None] & (k < K)[None, :])
    else:
        acc = _accumulate(acc, x_ptr, stride_xm, m, M, K, k, w)
    return acc


@triton.jit
def _finish(out_ptr, acc, m, n, M, N, split, DEQUANT: tl.constexpr):
    if not DEQUANT:
        store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def _kquant_scale_min(ptr, s):
    """Q4_K/Q5_K 6-bit (scale, min) of sub-blocks s (0..7) from the 12 packed bytes at ptr."""
    a = tl.load(ptr + s)
    b = tl.load(ptr + s + 4)
    c = tl.load(ptr + (s ^ 4))  # s - 4 for s >= 4 (unused below that)
    low = s < 4
    scale = tl.where(low, a & 63, (b & 15) | ((c >> 6) << 4))
    minimum = tl.where(low, b & 63, (b >> 4) | ((a >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


# --------------------------------------------------------------------------------------------------
# tensor-core kernels (half-precision activations, DOT_MIN_ROWS..16 rows): 32-element block formats,
# STEP // 32 blocks per step, tiles [BLOCK_N, blocks, elements]


@triton.jit
def _q4_0_tiles(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    BLOCKS: tl.constexpr = STEP // 32
    n_blocks = K // 32
    row = n.to(tl.int64)[:, None, None]
    b = tl.arange(0, BLOCKS)[None, :, None]
    i = tl.arange(0, 16)[None, None, :]
    j = tl.arange(0, BLOCKS * 16)
    k_low = (j // 16) * 32 + j % 16  # byte i of a block: element i (low nibble), i + 16 (high)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * BLOCKS + b
        ok = (n < N)[:, None, None] & (blk < n_blocks)
        qs = tl.load(qs_ptr + row * (n_blocks * 16) + blk * 16 + i, mask=ok, other=0)
        d = tl.load(d_ptr + row * n_blocks + blk, mask=ok, other=0.0).to(tl.float32)
        k = step * STEP + k_low
        low = ((qs & 15).to(tl.int32) - 8).to(tl.float32) * d
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, low, out_ptr, n, N, DEQUANT)
        high = ((qs >> 4).to(tl.int32) - 8).to(tl.float32) * d
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k + 16, high, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q4_0_dot(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q4_0_tiles(x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, BLOCK_M,
        BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q4_0(qs_ptr, d_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr):
    _q4_0_tiles(out_ptr, qs_ptr, d_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16, BLOCK_N, STEP, True)


@triton.jit
def _q4_1_tiles(
    x_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    BLOCKS: tl.constexpr = STEP // 32
    n_blocks = K // 32
    row = n.to(tl.int64)[:, None, None]
    b = tl.arange(0, BLOCKS)[None, :, None]
    i = tl.arange(0, 16)[None, None, :]
    j = tl.arange(0, BLOCKS * 16)
    k_low = (j // 16) * 32 + j % 16
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * BLOCKS + b
        ok = (n < N)[:, None, None] & (blk < n_blocks)
        qs = tl.load(qs_ptr + row * (n_blocks * 16) + blk * 16 + i, mask=ok, other=0)
        d = tl.load(d_ptr + row * n_blocks + blk, mask=ok, other=0.0).to(tl.float32)
        offset = tl.load(min_ptr + row * n_blocks + blk, mask=ok, other=0.0).to(tl.float32)
        k = step * STEP + k_low
        low = (qs & 15).to(tl.float32) * d + offset
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, low, out_ptr, n, N, DEQUANT)
        high = (qs >> 4).to(tl.float32) * d + offset
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k + 16, high, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q4_1_dot(
    x_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q4_1_tiles(x_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
        BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q4_1(qs_ptr, d_ptr, min_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr):
    _q4_1_tiles(out_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16, BLOCK_N, STEP, True)


@triton.jit
def _q5_0_tiles(
    x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    BLOCKS: tl.constexpr = STEP // 32
    n_blocks = K // 32
    row = n.to(tl.int64)[:, None, None]
    b = tl.arange(0, BLOCKS)[None, :, None]
    i = tl.arange(0, 16)[None, None, :]
    j = tl.arange(0, BLOCKS * 16)
    k_low = (j // 16) * 32 + j % 16
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * BLOCKS + b
        ok = (n < N)[:, None, None] & (blk < n_blocks)
        qs = tl.load(qs_ptr + row * (n_blocks * 16) + blk * 16 + i, mask=ok, other=0).to(tl.int32)
        qh = tl.load(qh_ptr + row * n_blocks + blk, mask=ok, other=0)  # bit e: 5th bit of element e
        d = tl.load(d_ptr + row * n_blocks + blk, mask=ok, other=0.0).to(tl.float32)
        k = step * STEP + k_low
        low = (((qs & 15) | (((qh >> i) & 1) << 4)) - 16).to(tl.float32) * d
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, low, out_ptr, n, N, DEQUANT)
        high = (((qs >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16).to(tl.float32) * d
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k + 16, high, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q5_0_dot(
    x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q5_0_tiles(x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
        BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q5_0(qs_ptr, qh_ptr, d_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr):
    _q5_0_tiles(out_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16, BLOCK_N, STEP, True)


@triton.jit
def _q8_0_tiles(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    BLOCKS: tl.constexpr = STEP // 32
    n_blocks = K // 32
    row = n.to(tl.int64)[:, None, None]
    b = tl.arange(0, BLOCKS)[None, :, None]
    i = tl.arange(0, 32)[None, None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * BLOCKS + b
        ok = (n < N)[:, None, None] & (blk < n_blocks)
        qs = tl.load(qs_ptr + row * K + blk * 32 + i, mask=ok, other=0)
        d = tl.load(d_ptr + row * n_blocks + blk, mask=ok, other=0.0).to(tl.float32)
        k = step * STEP + tl.arange(0, STEP)
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, qs.to(tl.float32) * d, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q8_0_dot(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q8_0_tiles(x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, BLOCK_M,
        BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q8_0(qs_ptr, d_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr):
    _q8_0_tiles(out_ptr, qs_ptr, d_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16, BLOCK_N, STEP, True)


# --------------------------------------------------------------------------------------------------
# K-quants: one 256-element super-block per step (K is a multiple of 256)


@triton.jit
def _q4_k_tiles(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    # element 64c + 32h + l = (qs[32c + l] >> 4h) & 15, sub-block 2c + h
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    n_super = K // 256
    row = tl.where(n < N, n, 0).to(tl.int64)  # rows past N read row 0 (in bounds, never stored)
    c = tl.arange(0, 4)[None, :]
    qs_offsets = row[:, None, None] * (n_super * 128) + c[:, :, None] * 32 + tl.arange(0, 32)[None, None, :]
    j = tl.arange(0, 128)
    k_low = (j // 32) * 64 + j % 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for sb in range(first, last):
        qs = tl.load(qs_ptr + qs_offsets + sb * 128)
        d = tl.load(d_ptr + row * n_super + sb).to(tl.float32)[:, None]
        dmin = tl.load(dmin_ptr + row * n_super + sb).to(tl.float32)[:, None]
        scales = scales_ptr + row[:, None] * (n_super * 12) + sb * 12
        for h in tl.static_range(2):
            sc, mn = _kquant_scale_min(scales, 2 * c + h)
            w = ((qs >> (4 * h)) & 15).to(tl.float32) * (d * sc)[:, :, None] - (dmin * mn)[:, :, None]
            k = sb * 256 + k_low + 32 * h
            acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, w, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q4_k_dot(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q4_k_tiles(x_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps,
        steps_per_split, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q4_k(
    d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr
):
    _q4_k_tiles(out_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16,
        BLOCK_N, STEP, True)  # fmt: skip


@triton.jit
def _q5_k_tiles(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    # as Q4_K, plus the 5th bit of element 32s + l = bit s of qh[l]
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    n_super = K // 256
    row = tl.where(n < N, n, 0).to(tl.int64)
    c = tl.arange(0, 4)[None, :]
    e = tl.arange(0, 32)[None, None, :]
    qs_offsets = row[:, None, None] * (n_super * 128) + c[:, :, None] * 32 + e
    qh_offsets = row[:, None, None] * (n_super * 32) + e
    j = tl.arange(0, 128)
    k_low = (j // 32) * 64 + j % 32
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for sb in range(first, last):
        qs = tl.load(qs_ptr + qs_offsets + sb * 128)
        qh = tl.load(qh_ptr + qh_offsets + sb * 32)
        d = tl.load(d_ptr + row * n_super + sb).to(tl.float32)[:, None]
        dmin = tl.load(dmin_ptr + row * n_super + sb).to(tl.float32)[:, None]
        scales = scales_ptr + row[:, None] * (n_super * 12) + sb * 12
        for h in tl.static_range(2):
            s = 2 * c + h
            sc, mn = _kquant_scale_min(scales, s)
            q = ((qs >> (4 * h)) & 15) | (((qh >> s[:, :, None]) & 1) << 4)
            w = q.to(tl.float32) * (d * sc)[:, :, None] - (dmin * mn)[:, :, None]
            k = sb * 256 + k_low + 32 * h
            acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, w, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q5_k_dot(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q5_k_tiles(x_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, M, N, K, stride_xm,
        n_steps, steps_per_split, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q5_k(
    d_ptr,
    dmin_ptr,
    scales_ptr,
    qh_ptr,
    qs_ptr,
    out_ptr,
    N,
    K,
    n_steps,
    BLOCK_N: tl.constexpr,
    STEP: tl.constexpr,
):
    _q5_k_tiles(out_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, 0, N, K, 0, n_steps, 1,
        16, BLOCK_N, STEP, True)  # fmt: skip


@triton.jit
def _q6_k_tiles(
    x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    # element 128a + 64h + 16g + i (r = 4a + g indexes the 16-byte runs of ql):
    # low 4 bits = (ql[16r + i] >> 4h) & 15, high 2 bits = (qh[32a + 16(g % 2) + i] >> 2(2h + g // 2)) & 3,
    # scale = scales[8a + 4h + g]
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    n_super = K // 256
    row = tl.where(n < N, n, 0).to(tl.int64)
    r = tl.arange(0, 8)[None, :]
    a = r // 4
    g = r % 4
    i = tl.arange(0, 16)[None, None, :]
    ql_offsets = row[:, None, None] * (n_super * 128) + r[:, :, None] * 16 + i
    qh_offsets = row[:, None, None] * (n_super * 64) + (a * 32 + (g % 2) * 16)[:, :, None] + i
    j = tl.arange(0, 128)
    k_low = (j // 64) * 128 + j % 64
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for sb in range(first, last):
        ql = tl.load(ql_ptr + ql_offsets + sb * 128)
        qh = tl.load(qh_ptr + qh_offsets + sb * 64)
        d = tl.load(d_ptr + row * n_super + sb).to(tl.float32)[:, None]
        scales = scales_ptr + row[:, None] * (n_super * 16) + sb * 16
        for h in tl.static_range(2):
            sc = tl.load(scales + 8 * a + 4 * h + g).to(tl.float32)
            high = (qh >> (2 * (2 * h + g // 2))[:, :, None]) & 3
            q = (((ql >> (4 * h)) & 15) | (high << 4)).to(tl.int32) - 32
            w = q.to(tl.float32) * (d * sc)[:, :, None]
            k = sb * 256 + k_low + 64 * h
            acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, w, out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_q6_k_dot(
    x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _q6_k_tiles(x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps,
        steps_per_split, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def dequant_q6_k(
    ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr
):
    _q6_k_tiles(out_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16,
        BLOCK_N, STEP, True)  # fmt: skip


# --------------------------------------------------------------------------------------------------
# F32 / F16 / BF16 weights (tensor-core path)


@triton.jit
def _float_tiles(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, DEQUANT: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    row = n.to(tl.int64)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        k = step * STEP + tl.arange(0, STEP)
        w = tl.load(w_ptr + row * K + k[None, :], mask=(n < N)[:, None] & (k < K)[None, :], other=0.0)
        acc = _consume(acc, x_ptr, stride_xm, m, M, K, k, w.to(tl.float32), out_ptr, n, N, DEQUANT)
    _finish(out_ptr, acc, m, n, M, N, split, DEQUANT)


@triton.jit
def gemv_float_dot(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _float_tiles(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, BLOCK_M, BLOCK_N,
        STEP, False)  # fmt: skip


@triton.jit
def dequant_float(w_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr):
    _float_tiles(out_ptr, w_ptr, out_ptr, 0, N, K, 0, n_steps, 1, 16, BLOCK_N, STEP, True)


# --------------------------------------------------------------------------------------------------
# vector kernels (M < DOT_MIN_ROWS, or float32 activations): the decode path, bound by weight bandwidth.
# A program owns a few output rows and walks K in wide steps (STEP input columns), so each thread has
# several 16-byte loads in flight and the grid has enough programs to cover the memory latency without
# split-K. Each step reads a [BLOCK_N, groups, bytes] tile, one group per scale: products are summed
# per group in the quant's integer-valued floats and scaled once per group (offsets, e.g. Q4_K's
# minimums, go through the group's activation sum), instead of scaling every element.


@triton.jit
def _f32(q, bias: tl.constexpr):
    """Integer q in [0, 2^23) -> float32 q - bias, exact: 0x4B000000 | q is the float 2^23 + q, an OR
    and a subtraction instead of an integer-to-float conversion (a quarter-rate instruction on NVIDIA)."""
    return (q.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + bias)


@triton.jit
def _x(x_ptr, stride_xm, m, M, k, K):
    """Activations x[m, k] as float32 (0 past M or K, which zeroes the products of clamped blocks)."""
    return tl.load(x_ptr + m * stride_xm + k, mask=(k < K) & (m < M), other=0.0).to(tl.float32)


@triton.jit
def _group_dot(w, x):
    """Per-group dot products [BLOCK_N, groups] of the tile w [BLOCK_N, groups, e] with x [groups, e]."""
    return tl.sum(w * x[None, :, :], axis=2)


@triton.jit
def gemv_q4_0(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # byte i of a block: element i (low nibble), i + 16 (high)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_blocks = K // 32
    i = tl.arange(0, 16)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * (STEP // 32) + tl.arange(0, STEP // 32)
        at = tl.minimum(blk, n_blocks - 1)[None, :]  # the tail's clamped blocks meet x = 0
        qs = tl.load(qs_ptr + row[:, None, None] * (n_blocks * 16) + at[:, :, None] * 16 + i[None])
        d = tl.load(d_ptr + row[:, None] * n_blocks + at).to(tl.float32)
        k = blk[:, None] * 32 + i
        low = _f32(qs & 15, 8.0)
        high = _f32(qs >> 4, 8.0)
        for r in tl.static_range(BLOCK_M):
            mr = tl.program_id(2) * BLOCK_M + r
            dot = _group_dot(low, _x(x_ptr, stride_xm, mr, M, k, K))
            dot += _group_dot(high, _x(x_ptr, stride_xm, mr, M, k + 16, K))
            acc = add_row(acc, r, d * dot)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q4_1(
    x_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_blocks = K // 32
    i = tl.arange(0, 16)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * (STEP // 32) + tl.arange(0, STEP // 32)
        at = tl.minimum(blk, n_blocks - 1)[None, :]
        qs = tl.load(qs_ptr + row[:, None, None] * (n_blocks * 16) + at[:, :, None] * 16 + i[None])
        d = tl.load(d_ptr + row[:, None] * n_blocks + at).to(tl.float32)
        offset = tl.load(min_ptr + row[:, None] * n_blocks + at).to(tl.float32)
        k = blk[:, None] * 32 + i
        low = _f32(qs & 15, 0.0)
        high = _f32(qs >> 4, 0.0)
        for r in tl.static_range(BLOCK_M):
            mr = tl.program_id(2) * BLOCK_M + r
            x_low = _x(x_ptr, stride_xm, mr, M, k, K)
            x_high = _x(x_ptr, stride_xm, mr, M, k + 16, K)
            dot = _group_dot(low, x_low) + _group_dot(high, x_high)
            x_sum = tl.sum(x_low + x_high, axis=1)[None, :]
            acc = add_row(acc, r, d * dot + offset * x_sum)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q5_0(
    x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_blocks = K // 32
    i = tl.arange(0, 16)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * (STEP // 32) + tl.arange(0, STEP // 32)
        at = tl.minimum(blk, n_blocks - 1)[None, :]
        qs = tl.load(qs_ptr + row[:, None, None] * (n_blocks * 16) + at[:, :, None] * 16 + i[None])
        qh = tl.load(qh_ptr + row[:, None] * n_blocks + at)[:, :, None]  # bit e: 5th bit of element e
        d = tl.load(d_ptr + row[:, None] * n_blocks + at).to(tl.float32)
        k = blk[:, None] * 32 + i
        low = _f32((qs & 15) | (((qh >> i[None]) & 1) << 4), 16.0)
        high = _f32((qs >> 4) | (((qh >> (i[None] + 16)) & 1) << 4), 16.0)
        for r in tl.static_range(BLOCK_M):
            mr = tl.program_id(2) * BLOCK_M + r
            dot = _group_dot(low, _x(x_ptr, stride_xm, mr, M, k, K))
            dot += _group_dot(high, _x(x_ptr, stride_xm, mr, M, k + 16, K))
            acc = add_row(acc, r, d * dot)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q8_0(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_blocks = K // 32
    i = tl.arange(0, 32)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * (STEP // 32) + tl.arange(0, STEP // 32)
        at = tl.minimum(blk, n_blocks - 1)[None, :]
        qs = tl.load(qs_ptr + row[:, None, None] * K + at[:, :, None] * 32 + i[None])
        d = tl.load(d_ptr + row[:, None] * n_blocks + at).to(tl.float32)
        q = _f32(qs.to(tl.int32) + 128, 128.0)
        k = blk[:, None] * 32 + i
        for r in tl.static_range(BLOCK_M):
            mr = tl.program_id(2) * BLOCK_M + r
            acc = add_row(acc, r, d * _group_dot(q, _x(x_ptr, stride_xm, mr, M, k, K)))
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q4_k(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # groups g = 4 * super-block + c of 32 qs bytes: byte l holds elements 64g + l (low nibble,
    # sub-block 2c) and 64g + 32 + l (high, sub-block 2c + 1)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    l = tl.arange(0, 32)[None, :]  # noqa: E741
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g = step * (STEP // 64) + tl.arange(0, STEP // 64)
        sb = tl.minimum(g // 4, n_super - 1)[None, :]
        c = (g % 4)[None, :]
        qs = tl.load(
            qs_ptr + row[:, None, None] * (n_super * 128) + (sb * 128 + c * 32)[:, :, None] + l[None]
        )
        d = tl.load(d_ptr + row[:, None] * n_super + sb).to(tl.float32)
        dmin = tl.load(dmin_ptr + row[:, None] * n_super + sb).to(tl.float32)
        scales = scales_ptr + row[:, None] * (n_super * 12) + sb * 12
        k = g[:, None] * 64 + l
        for h in tl.static_range(2):
            sc, mn = _kquant_scale_min(scales, 2 * c + h)
            q = _f32((qs >> (4 * h)) & 15, 0.0)
            for r in tl.static_range(BLOCK_M):
                x = _x(x_ptr, stride_xm, tl.program_id(2) * BLOCK_M + r, M, k + 32 * h, K)
                part = d * sc * _group_dot(q, x) - dmin * mn * tl.sum(x, axis=1)[None, :]
                acc = add_row(acc, r, part)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q5_k(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # as Q4_K, plus the 5th bit of element 32s + l = bit s of qh[l]
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    l = tl.arange(0, 32)[None, :]  # noqa: E741
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g = step * (STEP // 64) + tl.arange(0, STEP // 64)
        sb = tl.minimum(g // 4, n_super - 1)[None, :]
        c = (g % 4)[None, :]
        qs = tl.load(
            qs_ptr + row[:, None, None] * (n_super * 128) + (sb * 128 + c * 32)[:, :, None] + l[None]
        )
        qh = tl.load(qh_ptr + row[:, None, None] * (n_super * 32) + (sb * 32)[:, :, None] + l[None])
        d = tl.load(d_ptr + row[:, None] * n_super + sb).to(tl.float32)
        dmin = tl.load(dmin_ptr + row[:, None] * n_super + sb).to(tl.float32)
        scales = scales_ptr + row[:, None] * (n_super * 12) + sb * 12
        k = g[:, None] * 64 + l
        for h in tl.static_range(2):
            s = 2 * c + h
            sc, mn = _kquant_scale_min(scales, s)
            q = _f32(((qs >> (4 * h)) & 15) | (((qh >> s[:, :, None]) & 1) << 4), 0.0)
            for r in tl.static_range(BLOCK_M):
                x = _x(x_ptr, stride_xm, tl.program_id(2) * BLOCK_M + r, M, k + 32 * h, K)
                part = d * sc * _group_dot(q, x) - dmin * mn * tl.sum(x, axis=1)[None, :]
                acc = add_row(acc, r, part)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q6_k(
    x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # groups = the 16-byte runs r = 4a + g of ql (8 per super-block); element 128a + 64h + 16g + i:
    # low 4 bits = (ql[16r + i] >> 4h) & 15, high 2 bits = (qh[32a + 16(g % 2) + i] >> 2(2h + g // 2)) & 3,
    # scale = scales[8a + 4h + g]
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    i = tl.arange(0, 16)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        run = step * (STEP // 32) + tl.arange(0, STEP // 32)  # global run index, 8 per super-block
        sb = tl.minimum(run // 8, n_super - 1)[None, :]
        a = (run // 4 % 2)[None, :]
        g = (run % 4)[None, :]
        ql = tl.load(
            ql_ptr + row[:, None, None] * (n_super * 128) + (sb * 128 + (run % 8) * 16)[:, :, None] + i[None]
        )
        qh_at = sb * 64 + a * 32 + (g % 2) * 16
        qh = tl.load(qh_ptr + row[:, None, None] * (n_super * 64) + qh_at[:, :, None] + i[None])
        d = tl.load(d_ptr + row[:, None] * n_super + sb).to(tl.float32)
        scales = scales_ptr + row[:, None] * (n_super * 16) + sb * 16 + 8 * a + g
        k = (run // 4 * 128 + run % 4 * 16)[:, None] + i
        for h in tl.static_range(2):
            sc = tl.load(scales + 4 * h).to(tl.float32)
            high = (qh >> (2 * (2 * h + g // 2))[:, :, None]) & 3
            q = _f32(((ql >> (4 * h)) & 15) | (high << 4), 32.0)
            for r in tl.static_range(BLOCK_M):
                x = _x(x_ptr, stride_xm, tl.program_id(2) * BLOCK_M + r, M, k + 64 * h, K)
                acc = add_row(acc, r, d * sc * _group_dot(q, x))
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_float(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        k = step * STEP + tl.arange(0, STEP)[None, :]
        w = tl.load(w_ptr + row[:, None, None] * K + tl.minimum(k, K - 1)[None]).to(tl.float32)
        for r in tl.static_range(BLOCK_M):
            acc = add_row(
                acc, r, _group_dot(w, _x(x_ptr, stride_xm, tl.program_id(2) * BLOCK_M + r, M, k, K))
            )
    store_partials(out_ptr, acc, m, n, M, N, split)


# --------------------------------------------------------------------------------------------------
# codebook formats (IQ*): every format decodes groups of 32 elements (`_<format>_groups`: weight rows
# `row`, group indices g [G], in bounds) into values q [BLOCK_N, G, 32] (float32 integers: a level, or a
# lattice point times its sign) and one float32 scale per group [BLOCK_N, G], in gguf's operations, so
# q * scale is gguf's dequantized weight. The tables (planes.tables) are gathered from: a few KiB that
# stay in the L1/L2 caches. Column j of a group's values is element `order[j]` of it (`_nibble_order`
# for the IQ4 formats, whose two nibbles of a byte are joined side by side; `_natural_order` else).
# The vector kernels scale each group's dot product once; the tensor-core kernels multiply q by its
# scale as the reference does (their dequantizers: codebook_dequant).


@triton.jit
def _natural_order():
    return tl.arange(0, 32)


@triton.jit
def _nibble_order():
    """Column j = 2i + h of a joined (low, high) nibble pair i holds element 16h + i of the group."""
    j = tl.arange(0, 32)
    return (j % 2) * 16 + j // 2


@triton.jit
def _byte_values(words):
    """int32 words [BLOCK_N, G, P] of 4 values 0..255 each -> float32 [BLOCK_N, G, 4P]: byte b of word
    p at column 4p + b (the lattice point's element order)."""
    v = (words[:, :, :, None] >> (8 * tl.arange(0, 4))[None, None, None, :]) & 255
    return _f32(tl.reshape(v, (words.shape[0], words.shape[1], 4 * words.shape[2])), 0.0)


@triton.jit
def _signed(values, sign_bytes):
    """values [BLOCK_N, G, 32], element 8l + j negated where bit j of sign_bytes[..., l] (4 bytes) is set."""
    bits = (sign_bytes[:, :, :, None].to(tl.int32) >> tl.arange(0, 8)[None, None, None, :]) & 1
    return tl.where(tl.reshape(bits, values.shape) != 0, -values, values)


@triton.jit
def _iq4_nl_groups(qs_ptr, d_ptr, levels_ptr, row, g, n_groups):
    # d qs[16]: byte i holds elements i (low nibble) and i + 16 (high), 4-bit indices of the 16 levels
    at = row[:, None] * n_groups + g[None, :]
    qs = tl.load(qs_ptr + at[:, :, None] * 16 + tl.arange(0, 16)[None, None, :])
    codes = tl.reshape(tl.join(qs & 15, qs >> 4), (qs.shape[0], qs.shape[1], 32)).to(tl.int32)
    return tl.load(levels_ptr + codes), tl.load(d_ptr + at).to(tl.float32)


@triton.jit
def _iq4_xs_groups(d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, row, g, n_groups):
    # per 256: d, scales_h (2 high bits of group ib's 6-bit scale at bit 2ib), scales_l[4] (4 low bits,
    # nibble ib % 2 of byte ib // 2), qs[128] (16 bytes per group, nibbles as IQ4_NL); scale d * (ls - 32)
    sb, ib = super_block(row, g, n_groups)
    qs = tl.load(qs_ptr + (sb * 128 + ib * 16)[:, :, None] + tl.arange(0, 16)[None, None, :])
    codes = tl.reshape(tl.join(qs & 15, qs >> 4), (qs.shape[0], qs.shape[1], 32)).to(tl.int32)
    return tl.load(levels_ptr + codes), iq4_xs_scale(d_ptr, scales_h_ptr, scales_l_ptr, sb, ib)


@triton.jit
def _iq3_s_groups(d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, row, g, n_groups):
    sb, ib = super_block(row, g, n_groups)
    words, signs, scale = iq3_s_parts(d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, sb, ib)
    return _signed(_byte_values(words), signs), scale


@triton.jit
def _iq3_xxs_groups(d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, row, g, n_groups):
    sb, ib = super_block(row, g, n_groups)
    words, signs, scale = iq3_xxs_parts(d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, sb, ib)
    return _signed(_byte_values(words), signs), scale


@triton.jit
def _iq2_xxs_groups(d_ptr, qs_ptr, grid_ptr, ksigns_ptr, row, g, n_groups):
    sb, ib = super_block(row, g, n_groups)
    words, signs, scale = iq2_xxs_parts(d_ptr, qs_ptr, grid_ptr, ksigns_ptr, sb, ib)
    return _signed(_byte_values(words), signs), scale


@triton.jit
def _group_products(acc, q, scale, g, order, x_ptr, stride_xm, M, K, BLOCK_M: tl.constexpr):
    """The vector kernels' step: acc[r] += per group, scale * (q . x[r]) over the group's 32 columns."""
    k = g[:, None] * 32 + order[None, :]
    for r in tl.static_range(BLOCK_M):
        x = _x(x_ptr, stride_xm, tl.program_id(2) * BLOCK_M + r, M, k, K)
        acc = add_row(acc, r, scale * _group_dot(q, x))
    return acc


@triton.jit
def _accumulate_groups(acc, q, scale, g, order, x_ptr, stride_xm, m, M, K):
    """The tensor-core kernels' step: `_accumulate` of the weights q * scale of groups g."""
    k = tl.reshape(g[:, None] * 32 + order[None, :], (g.shape[0] * 32,))
    return _accumulate(acc, x_ptr, stride_xm, m, M, K, k, q * scale[:, :, None])


@triton.jit
def _steps(step, STEP: tl.constexpr, n_groups):
    """The groups g of K step `step` (32 columns each) and where they are read (clamped in bounds: the
    tail's clamped groups meet x = 0, and their dequantized columns are not stored)."""
    g = step * (STEP // 32) + tl.arange(0, STEP // 32)
    return g, tl.minimum(g, n_groups - 1)


@triton.jit
def _tile_program(M, N, n_steps, steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    n, m, split, first, last = _program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    return n, m, split, first, last, tl.where(n < N, n, 0).to(tl.int64)


@triton.jit
def gemv_iq4_nl(
    x_ptr, qs_ptr, d_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq4_nl_groups(qs_ptr, d_ptr, levels_ptr, row, at, K // 32)
        acc = _group_products(acc, q, scale, g, _nibble_order(), x_ptr, stride_xm, M, K, BLOCK_M)
    store_partials(out_ptr, acc, tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M), n, M, N, split)


@triton.jit
def _iq4_nl_tiles(
    x_ptr, qs_ptr, d_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last, row = _tile_program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq4_nl_groups(qs_ptr, d_ptr, levels_ptr, row, at, K // 32)
        acc = _accumulate_groups(acc, q, scale, g, _nibble_order(), x_ptr, stride_xm, m, M, K)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq4_nl_dot(
    x_ptr, qs_ptr, d_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _iq4_nl_tiles(x_ptr, qs_ptr, d_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
        BLOCK_M, BLOCK_N, STEP)  # fmt: skip


@triton.jit
def gemv_iq4_xs(
    x_ptr, d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split,
    ids_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq4_xs_groups(d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, row, at, K // 32)
        acc = _group_products(acc, q, scale, g, _nibble_order(), x_ptr, stride_xm, M, K, BLOCK_M)
    store_partials(out_ptr, acc, tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M), n, M, N, split)


@triton.jit
def _iq4_xs_tiles(
    x_ptr, d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last, row = _tile_program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq4_xs_groups(d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, row, at, K // 32)
        acc = _accumulate_groups(acc, q, scale, g, _nibble_order(), x_ptr, stride_xm, m, M, K)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq4_xs_dot(
    x_ptr, d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _iq4_xs_tiles(x_ptr, d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, out_ptr, M, N, K, stride_xm,
        n_steps, steps_per_split, BLOCK_M, BLOCK_N, STEP)  # fmt: skip


@triton.jit
def gemv_iq3_s(
    x_ptr, d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split,
    ids_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq3_s_groups(d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, row, at, K // 32)
        acc = _group_products(acc, q, scale, g, _natural_order(), x_ptr, stride_xm, M, K, BLOCK_M)
    store_partials(out_ptr, acc, tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M), n, M, N, split)


@triton.jit
def _iq3_s_tiles(
    x_ptr, d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last, row = _tile_program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq3_s_groups(d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, row, at, K // 32)
        acc = _accumulate_groups(acc, q, scale, g, _natural_order(), x_ptr, stride_xm, m, M, K)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq3_s_dot(
    x_ptr, d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _iq3_s_tiles(x_ptr, d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, out_ptr, M, N, K, stride_xm,
        n_steps, steps_per_split, BLOCK_M, BLOCK_N, STEP)  # fmt: skip


@triton.jit
def gemv_iq3_xxs(
    x_ptr, d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split,
    ids_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq3_xxs_groups(d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, row, at, K // 32)
        acc = _group_products(acc, q, scale, g, _natural_order(), x_ptr, stride_xm, M, K, BLOCK_M)
    store_partials(out_ptr, acc, tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M), n, M, N, split)


@triton.jit
def _iq3_xxs_tiles(
    x_ptr, d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last, row = _tile_program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq3_xxs_groups(d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, row, at, K // 32)
        acc = _accumulate_groups(acc, q, scale, g, _natural_order(), x_ptr, stride_xm, m, M, K)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq3_xxs_dot(
    x_ptr, d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _iq3_xxs_tiles(x_ptr, d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps,
        steps_per_split, BLOCK_M, BLOCK_N, STEP)  # fmt: skip


@triton.jit
def gemv_iq2_xxs(
    x_ptr, d_ptr, qs_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq2_xxs_groups(d_ptr, qs_ptr, grid_ptr, ksigns_ptr, row, at, K // 32)
        acc = _group_products(acc, q, scale, g, _natural_order(), x_ptr, stride_xm, M, K, BLOCK_M)
    store_partials(out_ptr, acc, tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M), n, M, N, split)


@triton.jit
def _iq2_xxs_tiles(
    x_ptr, d_ptr, qs_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    n, m, split, first, last, row = _tile_program(M, N, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g, at = _steps(step, STEP, K // 32)
        q, scale = _iq2_xxs_groups(d_ptr, qs_ptr, grid_ptr, ksigns_ptr, row, at, K // 32)
        acc = _accumulate_groups(acc, q, scale, g, _natural_order(), x_ptr, stride_xm, m, M, K)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq2_xxs_dot(
    x_ptr, d_ptr, qs_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_inputs(PDL)
    _iq2_xxs_tiles(x_ptr, d_ptr, qs_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, stride_xm, n_steps,
        steps_per_split, BLOCK_M, BLOCK_N, STEP)  # fmt: skip


@dataclass(frozen=True)
class Format:
    kernel: Any  # the vector kernel (triton.jit function)
    dot_kernel: Any  # the tensor-core kernel
    dequant_kernel: Any  # writes the dequantized matrix (prefill)
    step: int  # input columns per loop step of the tensor-core kernel (its STEP)
    block: int  # input columns per scale group: the vector kernel's STEP is a multiple


FORMATS: dict[GGMLQuantizationType, Format] = {
    Q.Q4_0: Format(gemv_q4_0, gemv_q4_0_dot, dequant_q4_0, 256, 32),
    Q.Q4_1: Format(gemv_q4_1, gemv_q4_1_dot, dequant_q4_1, 256, 32),
    Q.Q5_0: Format(gemv_q5_0, gemv_q5_0_dot, dequant_q5_0, 256, 32),
    Q.Q8_0: Format(gemv_q8_0, gemv_q8_0_dot, dequant_q8_0, 128, 32),
    Q.Q4_K: Format(gemv_q4_k, gemv_q4_k_dot, dequant_q4_k, 256, 64),
    Q.Q5_K: Format(gemv_q5_k, gemv_q5_k_dot, dequant_q5_k, 256, 64),
    Q.Q6_K: Format(gemv_q6_k, gemv_q6_k_dot, dequant_q6_k, 256, 32),
    Q.IQ4_NL: Format(gemv_iq4_nl, gemv_iq4_nl_dot, dequant_iq4_nl, 256, 32),
    Q.IQ4_XS: Format(gemv_iq4_xs, gemv_iq4_xs_dot, dequant_iq4_xs, 256, 32),
    Q.IQ3_S: Format(gemv_iq3_s, gemv_iq3_s_dot, dequant_iq3_s, 256, 32),
    Q.IQ3_XXS: Format(gemv_iq3_xxs, gemv_iq3_xxs_dot, dequant_iq3_xxs, 256, 32),
    Q.IQ2_XXS: Format(gemv_iq2_xxs, gemv_iq2_xxs_dot, dequant_iq2_xxs, 256, 32),
    Q.F32: Format(gemv_float, gemv_float_dot, dequant_float, 128, 1),
    Q.F16: Format(gemv_float, gemv_float_dot, dequant_float, 128, 1),
    Q.BF16: Format(gemv_float, gemv_float_dot, dequant_float, 128, 1),
}

"""Skinny quantized products y = x @ W^T for decode and small batches (M = 1..16 activation rows).

Weight layout ("field planes", made once by `prepare`): each GGUF block is a packed struct (fp16 scales,
then quant bytes); the kernels read each field from its own contiguous plane instead, row-major
[N, n_blocks * field bytes], fp16 fields viewed as float16 and Q5_0's 4 high-bit bytes as one int32.
That is a pure byte permutation of the file (`split_fields`; joining the planes block by block gives
the file's bytes back), so a row tile's quant bytes are one contiguous, aligned run that loads in wide
vectors, which the 18/20/22/34-byte structs of the 32-element formats prevent. F16/BF16/F32 weights
keep their own dtype ([N, K]).

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
    vector units (float32 weights, within float32 rounding of the reference);
  - float16/bfloat16 activations with DOT_MIN_ROWS..16 rows on NVIDIA: `tl.dot` on the tensor cores
    with the tile rounded to the activation dtype, BLOCK_M = 16 (on ROCm that tile spilled registers
    on gfx1151, so AMD keeps the vector path until it is tuned).
Block sizes are ones that compiled without register spills for sm_90 and gfx1151; speed tuning on
the H200 is still to come.
M > 16 launches more row tiles, each re-reading the weights: prefill wants a GEMM of its own.

Split-K, for matrices with too few row tiles to fill the GPU: the K steps are cut into `splits`
ranges, one per program along grid axis 1, writing float32 partials [splits, M, N] that are summed
afterwards; deterministic (no atomics), so repeated runs give identical tokens.

No CUDA-only intrinsics or inline asm: the same source compiles for NVIDIA and AMD (wave64 and wave32).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from gufo.errors import BadInputError
from gufo.formats import block_shape
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.linear_reference import raw_rows
from gufo.kernels.registry import register
from gufo.kernels.triton import dependent_launch
from gufo.kernels.triton.dependent_launch import wait_for_inputs

Q = GGMLQuantizationType

DOT_MIN_ROWS = 4  # from here on half-precision activations go through tl.dot (tensor cores)
MAX_BLOCK_M = 16
VECTOR_BLOCK_M = (
    4  # activation rows per program of the vector kernels (unrolled: each adds one FMA per weight)
)
MAX_SPLITS = 16
# Operands of the prefill product (M > MAX_BLOCK_M) for block formats: float16 has 3 more mantissa bits
# than bfloat16 at the same tensor-core rate, and the weights' own scales are float16. bfloat16 operands
# swapped a near-tie of gemma3-270m's top-1 against decode (`--validate-prefill 256`, docs/BENCHMARKS.md).
# Activations past float16's range become inf: non-finite logits, which every check reports.
PREFILL_DTYPE = torch.float16
# float weights multiply in their own precision at prefill, so the file's values reach the product as
# they are (bf16 would round F16/F32 weights; found on an F32 qwen35 file: logits 1.2 off the CPU)
FLOAT_PREFILL_DTYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
# BLOCK_N of the tl.dot path: compiled without register spills for sm_90 with Triton 3.6 and 4 warps,
# checked offline with `gufo kernels report` on the Triton cache.
DOT_BLOCK_N = 32
NUM_WARPS = 4

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
def _store(out_ptr, acc, m, n, M, N, split):
    """out[split, m, n] = acc (converted to out's dtype)."""
    rows = (split * M + m[:, None]).to(tl.int64)
    tl.store(out_ptr + rows * N + n[None, :], acc, mask=(m < M)[:, None] & (n < N)[None, :])


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
        _store(out_ptr, acc, m, n, M, N, split)


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
def _vector_program(N, n_steps, steps_per_split, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """Output rows n, their weight rows (rows past N read row 0: in bounds, never stored), the split
    index and its K-step range [first, last); first waits for the kernel before (dependent_launch)."""
    wait_for_inputs(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.where(n < N, n, 0).to(tl.int64)
    split = tl.program_id(1)
    first = split * steps_per_split
    return n, row, split, first, tl.minimum(first + steps_per_split, n_steps)


@triton.jit
def _x(x_ptr, stride_xm, m, M, k, K):
    """Activations x[m, k] as float32 (0 past M or K, which zeroes the products of clamped blocks)."""
    return tl.load(x_ptr + m * stride_xm + k, mask=(k < K) & (m < M), other=0.0).to(tl.float32)


@triton.jit
def _group_dot(w, x):
    """Per-group dot products [BLOCK_N, groups] of the tile w [BLOCK_N, groups, e] with x [groups, e]."""
    return tl.sum(w * x[None, :, :], axis=2)


@triton.jit
def _add_row(acc, i, part):
    """acc[i, :] += sum of part [BLOCK_N, groups] over its groups."""
    rows = tl.arange(0, acc.shape[0])[:, None]
    return tl.where(rows == i, acc + tl.sum(part, axis=1)[None, :], acc)


@triton.jit
def gemv_q4_0(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # byte i of a block: element i (low nibble), i + 16 (high)
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
            acc = _add_row(acc, r, d * dot)
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q4_1(
    x_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
            acc = _add_row(acc, r, d * dot + offset * x_sum)
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q5_0(
    x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
            acc = _add_row(acc, r, d * dot)
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q8_0(
    x_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
            acc = _add_row(acc, r, d * _group_dot(q, _x(x_ptr, stride_xm, mr, M, k, K)))
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q4_k(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # groups g = 4 * super-block + c of 32 qs bytes: byte l holds elements 64g + l (low nibble,
    # sub-block 2c) and 64g + 32 + l (high, sub-block 2c + 1)
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
                acc = _add_row(acc, r, part)
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q5_k(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, M, N, K, stride_xm, n_steps,
    steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # as Q4_K, plus the 5th bit of element 32s + l = bit s of qh[l]
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
                acc = _add_row(acc, r, part)
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q6_k(
    x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # groups = the 16-byte runs r = 4a + g of ql (8 per super-block); element 128a + 64h + 16g + i:
    # low 4 bits = (ql[16r + i] >> 4h) & 15, high 2 bits = (qh[32a + 16(g % 2) + i] >> 2(2h + g // 2)) & 3,
    # scale = scales[8a + 4h + g]
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
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
                acc = _add_row(acc, r, d * sc * _group_dot(q, x))
    _store(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_float(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    n, row, split, first, last = _vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        k = step * STEP + tl.arange(0, STEP)[None, :]
        w = tl.load(w_ptr + row[:, None, None] * K + tl.minimum(k, K - 1)[None]).to(tl.float32)
        for r in tl.static_range(BLOCK_M):
            acc = _add_row(
                acc, r, _group_dot(w, _x(x_ptr, stride_xm, tl.program_id(2) * BLOCK_M + r, M, k, K))
            )
    _store(out_ptr, acc, m, n, M, N, split)


# --------------------------------------------------------------------------------------------------
# host side


@dataclass(frozen=True)
class Field:
    start: int  # byte range inside a GGUF block
    end: int
    dtype: torch.dtype  # how the plane is viewed (float16 for scales, int32 for Q5_0's high bits)


@dataclass(frozen=True)
class Format:
    kernel: Any  # the vector kernel (triton.jit function)
    dot_kernel: Any  # the tensor-core kernel
    dequant_kernel: Any  # writes the dequantized matrix (prefill)
    fields: tuple[Field, ...]  # in the kernels' argument order
    step: int  # input columns per loop step of the tensor-core kernel (its STEP)
    block: int  # input columns per scale group: the vector kernel's STEP is a multiple


U8, I8, F16 = torch.uint8, torch.int8, torch.float16
_K4 = (Field(0, 2, F16), Field(2, 4, F16), Field(4, 16, U8))  # Q4_K/Q5_K d, dmin, packed scales

FORMATS: dict[GGMLQuantizationType, Format] = {
    Q.Q4_0: Format(gemv_q4_0, gemv_q4_0_dot, dequant_q4_0, (Field(2, 18, U8), Field(0, 2, F16)), 256, 32),
    Q.Q4_1: Format(
        gemv_q4_1,
        gemv_q4_1_dot,
        dequant_q4_1,
        (Field(4, 20, U8), Field(0, 2, F16), Field(2, 4, F16)),
        256,
        32,
    ),
    Q.Q5_0: Format(
        gemv_q5_0,
        gemv_q5_0_dot,
        dequant_q5_0,
        (Field(6, 22, U8), Field(2, 6, torch.int32), Field(0, 2, F16)),
        256,
        32,
    ),
    Q.Q8_0: Format(gemv_q8_0, gemv_q8_0_dot, dequant_q8_0, (Field(2, 34, I8), Field(0, 2, F16)), 128, 32),
    Q.Q4_K: Format(gemv_q4_k, gemv_q4_k_dot, dequant_q4_k, (*_K4, Field(16, 144, U8)), 256, 64),
    Q.Q5_K: Format(
        gemv_q5_k, gemv_q5_k_dot, dequant_q5_k, (*_K4, Field(16, 48, U8), Field(48, 176, U8)), 256, 64
    ),
    Q.Q6_K: Format(
        gemv_q6_k,
        gemv_q6_k_dot,
        dequant_q6_k,
        (Field(0, 128, U8), Field(128, 192, U8), Field(192, 208, I8), Field(208, 210, F16)),
        256,
        32,
    ),
    Q.F32: Format(gemv_float, gemv_float_dot, dequant_float, (Field(0, 4, torch.float32),), 128, 1),
    Q.F16: Format(gemv_float, gemv_float_dot, dequant_float, (Field(0, 2, F16),), 128, 1),
    Q.BF16: Format(gemv_float, gemv_float_dot, dequant_float, (Field(0, 2, torch.bfloat16),), 128, 1),
}


def split_fields(qtype: GGMLQuantizationType, raw: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """GGUF rows uint8 [N, row_bytes] -> one contiguous plane per block field, [N, n_blocks * field]
    viewed as the field's dtype, in the kernel's argument order (a byte permutation of `raw`)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, block_shape(qtype)[1])
    fields = FORMATS[qtype].fields
    return tuple(blocks[..., f.start : f.end].reshape(rows, -1).contiguous().view(f.dtype) for f in fields)


def join_fields(qtype: GGMLQuantizationType, planes: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Inverse of split_fields: the GGUF rows, each block's fields put back at their byte ranges."""
    rows, fields = planes[0].shape[0], FORMATS[qtype].fields
    pieces = [
        p.view(torch.uint8).reshape(rows, -1, f.end - f.start) for p, f in zip(planes, fields, strict=True)
    ]
    order = sorted(range(len(fields)), key=lambda i: fields[i].start)
    return torch.cat([pieces[i] for i in order], dim=-1).reshape(rows, -1)


@dataclass(frozen=True)
class TritonWeight:
    qtype: GGMLQuantizationType
    shape: tuple[int, int]  # (N, K)
    planes: tuple[torch.Tensor, ...]


def _default_device() -> torch.device:
    """The current GPU; the CPU when none is visible (the Triton interpreter runs on CPU tensors)."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _splits(device: torch.device, tiles: int, n_steps: int) -> int:
    """Enough K splits for about two programs per multiprocessor (1 off the GPU). `tiles` counts the
    output-row tiles only: the split, hence each row's summation order, must not depend on how many
    activation rows there are, so that M rows give each row's M = 1 numbers (batch invariance)."""
    if device.type != "cuda":
        return 1
    return max(1, min(n_steps, MAX_SPLITS, 2 * _multiprocessors(device) // tiles))


@dataclass(frozen=True)
class VectorConfig:
    block_n: int  # output rows per program
    step: int  # input columns per loop step
    num_warps: int


# Widest K step of the vector kernels: 2048 columns, except Q4_0, whose one-row 2048 step compiled with
# a 40-byte stack frame for sm_90 with Triton 3.6 (`gufo kernels own --target sm_90`); 1024 has none.
MAX_VECTOR_STEP = {Q.Q4_0: 1024}


def vector_config(qtype: GGMLQuantizationType, n: int, k: int) -> VectorConfig:
    """Launch shape of the vector kernel for an [n, k] weight: 4 rows x 2048 columns per step was the
    fastest of 8 shapes tried for Q4_K/Q6_K/Q8_0 at M = 1 on the H200 (scripts/gemv_bandwidth.py)."""
    widest = MAX_VECTOR_STEP.get(qtype, 2048)
    return VectorConfig(4, max(FORMATS[qtype].block, min(widest, triton.next_power_of_2(k))), 4)


INT8_FORMATS = (Q.Q8_0, Q.Q4_K, Q.Q6_K)  # vector products on int8 activations (gemv_int8.py)


def int8_config(qtype: GGMLQuantizationType, n: int, k: int) -> VectorConfig:
    """Launch shape of the int8 kernels for an [n, k] weight, the fastest of 11 shapes at M = 1 on the
    H200 (scripts/gemv_bandwidth.py --sweep, docs/BENCHMARKS.md): Q8_0 4 rows x 1024 columns on 2
    warps; Q6_K 8 x 2048; Q4_K 8 x 2048 for matrices taller than wide (gate/up, qkv), else 4 x 2048
    (down, attention output). Q8_0 stays at 1024 columns: its 2-row 2048 step compiled with an 8-byte
    stack frame for sm_90 (Triton 3.6)."""
    if qtype == Q.Q8_0:
        rows, step, warps = 4, 1024, 2
    else:
        rows, step, warps = (8 if qtype == Q.Q6_K or n > k else 4), 2048, 4
    return VectorConfig(rows, max(FORMATS[qtype].block, min(step, triton.next_power_of_2(k))), warps)


# Smallest matrix (N * K weights) whose float32 activations are quantized to int8 for its products; the
# smaller ones multiply float32 activations as they are. Rounding to int8 makes the forward pass
# discontinuous: float32 summation-order differences (decode vs prefill, a CUDA graph vs eager launches)
# flip some roundings. On gemma3-270m, all of whose int8-format layer matrices are under 2^21 weights, that
# moved the logits after 256 tokens by up to 0.9 (0.12 below the limit) and swapped a near-tied top-1
# between decode and prefill. The int8 path still wins per product on small matrices, but a small
# model's decode is bound by its chain of short kernels: gemma3-270m decodes about 4% slower below the
# limit, where int8 made Qwen3-8B decode 1.3-1.47x and Qwen3-1.7B 1.15x faster (every product of those
# at least 2^21; docs/BENCHMARKS.md, "int8 activations only for large matrices").
# GUFO_INT8_MIN_WEIGHTS overrides it (0: int8 for every matrix of those formats).
INT8_LIMIT_ENV = "GUFO_INT8_MIN_WEIGHTS"
DEFAULT_INT8_MIN_WEIGHTS = 2**21


def _int8_min_weights() -> int:
    text = os.environ.get(INT8_LIMIT_ENV)
    if text is None:
        return DEFAULT_INT8_MIN_WEIGHTS
    if not text.strip().isdigit():
        raise BadInputError(
            f"{INT8_LIMIT_ENV}={text!r}: expected a whole number of weights (0: int8 activations for every "
            "matrix of the formats that have int8 kernels)"
        )
    return int(text)


INT8_MIN_WEIGHTS = _int8_min_weights()


def runs_on_int8(weight: TritonWeight) -> bool:
    """Whether the products of this weight on float32 activations quantize them to int8 first
    (gemv_int8.py): a format with int8 kernels, whose dot4 is native (NVIDIA) or emulated by the Triton
    interpreter (CPU tensors), and a matrix of at least INT8_MIN_WEIGHTS weights."""
    n, k = weight.shape
    return weight.qtype in INT8_FORMATS and torch.version.hip is None and n * k >= INT8_MIN_WEIGHTS


def int8_activations(x: torch.Tensor, weight: TritonWeight) -> bool:
    """Whether the vector product of x and weight runs on int8 activations: float32 x (what the engine
    decodes with) and a weight that `runs_on_int8`."""
    return x.dtype == torch.float32 and runs_on_int8(weight)


def takes_int8_rows(weight: TritonWeight, rows: int) -> bool:
    """Whether a product of `rows` float32 rows runs on int8 activations, so the kernel that makes its
    input may hand it `Int8Rows` (the fused norms and activation) instead of float32 rows."""
    return runs_on_int8(weight) and 0 < rows <= MAX_BLOCK_M


def gemv(x: torch.Tensor | Int8Rows, weight: TritonWeight, splits: int | None = None) -> torch.Tensor:
    """x [..., K] (float32/float16/bfloat16, on the weight's device; or float32 rows already quantized
    to `Int8Rows` for a format in INT8_FORMATS) -> x @ W^T [..., N] in x's dtype.

    `splits`: number of K ranges (split-K); None picks one from the device's size.
    """
    n, k = weight.shape
    fmt = FORMATS[weight.qtype]
    quantized = isinstance(x, Int8Rows)
    if quantized and weight.qtype not in INT8_FORMATS:
        raise ValueError(f"int8 rows given to a {weight.qtype.name} product, which has no int8 kernel")
    dtype = torch.float32 if quantized else x.dtype
    lead = x.shape[:-1]
    x2 = x if quantized else x.reshape(-1, k)
    if not quantized and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    # ROCm: the tl.dot tile spilled to scratch on gfx1151 in every size tried, so AMD stays on the vector path
    if dtype != torch.float32 and m >= DOT_MIN_ROWS and torch.version.hip is None:
        kernel, block_m, block_n, step, warps = fmt.dot_kernel, MAX_BLOCK_M, DOT_BLOCK_N, fmt.step, NUM_WARPS
        int8 = False
    else:
        int8 = quantized or int8_activations(x, weight)
        config = (int8_config if int8 else vector_config)(weight.qtype, n, k)
        kernel, block_n, step, warps = fmt.kernel, config.block_n, config.step, config.num_warps
        block_m = min(VECTOR_BLOCK_M, triton.next_power_of_2(max(m, 1)))
    grid_n, grid_m = triton.cdiv(n, block_n), triton.cdiv(m, block_m)
    n_steps = triton.cdiv(k, step)
    if splits is None:
        splits = _splits(x.device, grid_n, n_steps)
    per_split = triton.cdiv(n_steps, max(1, min(splits, n_steps)))
    splits = triton.cdiv(n_steps, per_split)  # no empty ranges
    out = torch.empty(splits, m, n, dtype=dtype if splits == 1 else torch.float32, device=x.device)
    if m and int8:
        from gufo.kernels.triton import gemv_int8  # that module builds on this one's device helpers

        grid = (grid_n, splits, grid_m)
        gemv_int8.launch(
            x2, weight.qtype, weight.planes, out, grid, n_steps, per_split, block_m, block_n, step, warps
        )
    elif m:
        kernel[(grid_n, splits, grid_m)](
            x2, *weight.planes, out, m, n, k, x2.stride(0), n_steps, per_split,
            BLOCK_M=block_m, BLOCK_N=block_n, STEP=step, num_warps=warps,
            **dependent_launch.launch_options(out.device),
        )  # fmt: skip
    y = out[0] if splits == 1 else out.sum(0).to(dtype)
    return y.reshape(*lead, n)


DEQUANT_BLOCK_N = 32  # output rows per program of the dequant kernels (one K step each)


def dequantize_weight(weight: TritonWeight, dtype: torch.dtype = PREFILL_DTYPE) -> torch.Tensor:
    """The whole matrix [N, K] in `dtype`, dequantized on the device by the format's Triton kernel
    (the same tile code as the tensor-core gemv, so both round identically before the product)."""
    n, k = weight.shape
    fmt = FORMATS[weight.qtype]
    out = torch.empty(n, k, dtype=dtype, device=weight.planes[0].device)
    n_steps = triton.cdiv(k, fmt.step)
    if n:
        fmt.dequant_kernel[(triton.cdiv(n, DEQUANT_BLOCK_N), n_steps, 1)](
            *weight.planes, out, n, k, n_steps, BLOCK_N=DEQUANT_BLOCK_N, STEP=fmt.step, num_warps=NUM_WARPS
        )
    return out


def _product(x: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """x @ dense^T, float32 out: for half-precision operands on CUDA straight from the float32
    accumulators (cuBLAS with out_dtype, no rounding of the result and no conversion pass); elsewhere
    (float32 operands, ROCm, the CPU interpreter) the product's own result widened."""
    x2 = x.reshape(-1, x.shape[-1])
    if x.dtype != torch.float32 and x.device.type == "cuda" and torch.version.hip is None:
        y = torch.mm(x2, dense.T, out_dtype=torch.float32)
    else:
        y = (x2 @ dense.T).float()
    return y.reshape(*x.shape[:-1], -1)


def _prefill_operand(x: torch.Tensor, weight: TritonWeight, dtype: torch.dtype) -> torch.Tensor:
    """x as the prefill product multiplies it, in dtype. Where decode multiplies int8 activations
    (`int8_activations`), x is first rounded to those same values, so both paths compute one function up
    to float16 weights and summation order."""
    if not int8_activations(x, weight):
        return x.to(dtype)
    from gufo.kernels.triton import gemv_int8  # that module builds on this one's device helpers

    rows = x.reshape(-1, x.shape[-1])
    return gemv_int8.round_rows(rows if rows.stride(-1) == 1 else rows.contiguous(), dtype).reshape(x.shape)


class TritonLinear:
    """Registered on the "cuda" backend for every qtype in FORMATS."""

    name = "triton-gemv"

    @staticmethod
    def prepare(info: TensorInfo, device: torch.device | None = None) -> TritonWeight:
        """Upload the raw GGUF rows once, then split them into field planes on the device."""
        raw = raw_rows(info).to(device or _default_device())
        return TritonWeight(info.qtype, (raw.shape[0], info.shape[-1]), split_fields(info.qtype, raw))

    @staticmethod
    def takes_int8(weight: TritonWeight, rows: int) -> bool:
        return takes_int8_rows(weight, rows)

    @staticmethod
    def apply(x: torch.Tensor | Int8Rows, weight: TritonWeight) -> torch.Tensor:
        if isinstance(x, Int8Rows) or x.numel() // weight.shape[1] <= MAX_BLOCK_M:
            return gemv(x, weight)
        # Prefill: dequantize the matrix to float16 on the device (one Triton pass, a few ms for an 8B
        # model), then one cuBLAS product on the tensor cores with float32 accumulation: faster at
        # prefill sizes than the fused-dequant tile kernels (docs/BENCHMARKS.md, "prefill products").
        dtype = FLOAT_PREFILL_DTYPES.get(weight.qtype, PREFILL_DTYPE)
        operand = _prefill_operand(x, weight, dtype)
        return _product(operand, dequantize_weight(weight, dtype)).to(x.dtype)


# Weight shapes [N, K] of a real model (Qwen3-0.6B: MLP down, gate/up, attention output, query). Every
# format divides their widths, which give each vector-kernel STEP with one K step and with several.
REFERENCE_SHAPES = ((1024, 3072), (3072, 1024), (1024, 2048), (2048, 1024))
# and a weight past dependent_launch.PREFETCH_MAX_BYTES in every format (its products do not prefetch)
LARGE_SHAPE = (8192, 4096)
# and weights under INT8_MIN_WEIGHTS (gemma3-270m's attention output and FFN down), whose products
# multiply float32 activations in the formats with int8 kernels too
SMALL_SHAPES = ((640, 1024), (640, 2048))


def _meta_weight(qtype: GGMLQuantizationType, n: int, k: int) -> TritonWeight:
    elements, nbytes = block_shape(qtype)
    raw = torch.empty(n, k // elements * nbytes, dtype=torch.uint8, device="meta")
    return TritonWeight(qtype, (n, k), split_fields(qtype, raw))


def launch_examples():
    """For `gufo kernels own` (gufo.kernels.triton.offline, which intercepts the launches): the
    engine's products on the reference and small shapes, as meta tensors: float32 activations of
    1..MAX_BLOCK_M rows (decode, speculative, batched) and one more (prefill), plus the tensor-core
    kernels at the half precision they exist for (NVIDIA); one row on the large shape. Yields each
    format's label before its launches."""
    for qtype in FORMATS:
        yield qtype.name.lower()
        for n, k in REFERENCE_SHAPES + SMALL_SHAPES:
            weight = _meta_weight(qtype, n, k)
            for m in range(1, MAX_BLOCK_M + 2):
                TritonLinear.apply(torch.empty(m, k, device="meta"), weight)
            if torch.version.hip is None:  # gemv takes the tensor-core path on NVIDIA only
                gemv(torch.empty(MAX_BLOCK_M, k, dtype=PREFILL_DTYPE, device="meta"), weight)
        n, k = LARGE_SHAPE
        TritonLinear.apply(torch.empty(1, k, device="meta"), _meta_weight(qtype, n, k))


for _qtype in FORMATS:
    register("cuda", "linear", _qtype)(TritonLinear)

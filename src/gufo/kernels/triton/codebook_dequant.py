"""The prefill dequantizers of the codebook formats (IQ*): each writes the whole matrix [N, K] in the
output's dtype, bit for bit gguf's values rounded once (prefill_gemm.dequantize_weight).

A program owns BLOCK_N rows and one K step of STEP columns (STEP // 32 groups; the arguments are the
other formats' dequantizers', whose n_steps these do not need). Its tiles end in runs
of 8 consecutive columns, so that a thread's values are stored as one 16-byte vector of float16 (IQ4:
the low nibbles of a group's 16 bytes are its elements 0..15, the high ones 16..31, stored as two
halves; lattice formats: one sign byte's 8 elements). The tensor-core kernels' tile code joins the
nibbles side by side (the product does not care about the column order); stored, that order compiled
to one 2-byte store per element, the lanes of a warp on 32 different rows (sm_90, Triton 3.6).

Values come from the tables of planes.tables: the IQ4 levels as float32 (one L1 read per element, no
integer conversion), the lattice points as int32 words of 4 byte values (one read per 4 elements).
"""

from __future__ import annotations

import triton
import triton.language as tl

from gufo.kernels.triton.codebook_groups import (
    iq2_xxs_parts,
    iq3_s_parts,
    iq3_xxs_parts,
    iq4_xs_scale,
    super_block,
)


@triton.jit
def _tile(N, K, BLOCK_N: tl.constexpr, STEP: tl.constexpr):
    """This program's weight rows [BLOCK_N] (past N: row 0, in bounds, never stored), groups g [G] of its
    K step and the groups read (clamped in bounds), the store mask [BLOCK_N, G] and the rows' first
    output elements [BLOCK_N, 1, 1] (int64: N * K may pass 2^31; the columns added to them are int32)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    g = tl.program_id(1) * (STEP // 32) + tl.arange(0, STEP // 32)
    n_groups = K // 32
    ok = (n < N)[:, None] & (g < n_groups)[None, :]
    row = tl.where(n < N, n, 0).to(tl.int64)
    return row, g, tl.minimum(g, n_groups - 1), ok, n.to(tl.int64)[:, None, None] * K


@triton.jit
def _runs():
    """Byte 8r + e of a group's 16 [1, 1, 2, 8]: tiles of runs of 8, so that a thread's bytes (8, one
    8-byte load) and its values (8 columns, one 16-byte store of float16) are the same elements, with
    no exchange between the threads in between."""
    return 8 * tl.arange(0, 2)[None, None, :, None] + tl.arange(0, 8)[None, None, None, :]


@triton.jit
def _store_halves(out_ptr, start, g, ok, low, high):
    """Elements 0..15 (low [BLOCK_N, G, 2, 8], `_runs`) and 16..31 (high) of groups g."""
    at = out_ptr + start[:, :, :, None] + (g * 32)[None, :, None, None] + _runs()
    tl.store(at, low.to(out_ptr.dtype.element_ty), mask=ok[:, :, None, None])
    tl.store(at + 16, high.to(out_ptr.dtype.element_ty), mask=ok[:, :, None, None])


@triton.jit
def dequant_iq4_nl(
    qs_ptr, d_ptr, levels_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr
):  # fmt: skip
    # per 32: d, qs[16] (byte i: elements i (low nibble) and 16 + i (high), indices of the 16 levels)
    row, g, at, ok, start = _tile(N, K, BLOCK_N, STEP)
    block = row[:, None] * (K // 32) + at[None, :]
    qs = tl.load(qs_ptr + block[:, :, None, None] * 16 + _runs()).to(tl.int32)
    d = tl.load(d_ptr + block).to(tl.float32)[:, :, None, None]
    low = tl.load(levels_ptr + (qs & 15)) * d
    high = tl.load(levels_ptr + (qs >> 4)) * d
    _store_halves(out_ptr, start, g, ok, low, high)


@triton.jit
def dequant_iq4_xs(
    d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, out_ptr, N, K, n_steps,
    BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    # per 256: d, scales_h, scales_l[4] (codebook_groups.iq4_xs_scale), qs[128] (16 bytes per group,
    # nibbles as IQ4_NL)
    row, g, at, ok, start = _tile(N, K, BLOCK_N, STEP)
    sb, ib = super_block(row, at, K // 32)
    qs = tl.load(qs_ptr + (sb * 128 + ib * 16)[:, :, None, None] + _runs()).to(tl.int32)
    scale = iq4_xs_scale(d_ptr, scales_h_ptr, scales_l_ptr, sb, ib)[:, :, None, None]
    low = tl.load(levels_ptr + (qs & 15)) * scale
    high = tl.load(levels_ptr + (qs >> 4)) * scale
    _store_halves(out_ptr, start, g, ok, low, high)


@triton.jit
def _store_points(out_ptr, start, g, ok, words, signs, scale):
    """Groups g of lattice points: words [BLOCK_N, G, 8] (4 byte values each, element 4p + b = byte b
    of word p), sign bytes [BLOCK_N, G, 4] (bit j of byte l: element 8l + j negative) and scales
    [BLOCK_N, G]; stored as the runs of 8 columns of each sign byte."""
    pairs = tl.reshape(words, (words.shape[0], words.shape[1], 4, 2))
    even, odd = tl.split(pairs)  # words 2l and 2l + 1: elements 8l..8l + 3 and 8l + 4..8l + 7
    e = tl.arange(0, 8)[None, None, None, :]
    word = tl.where(e < 4, even[:, :, :, None], odd[:, :, :, None])
    # byte value v | 0x4B000000 is the float 2^23 + v: exact, without an integer conversion; the sign
    # bit of element e is bit e of its sign byte, moved to bit 31
    bits = ((word >> (8 * (e % 4))) & 255) | 0x4B000000
    value = bits.to(tl.float32, bitcast=True) - 8388608.0
    negative = (signs[:, :, :, None].to(tl.int32) << (31 - e)) & -2147483648
    signed = (value.to(tl.int32, bitcast=True) ^ negative).to(tl.float32, bitcast=True)
    w = (signed * scale[:, :, None, None]).to(out_ptr.dtype.element_ty)
    column = (g * 32)[None, :, None, None] + 8 * tl.arange(0, 4)[None, None, :, None] + e
    tl.store(out_ptr + start[:, :, :, None] + column, w, mask=ok[:, :, None, None])


@triton.jit
def dequant_iq3_s(
    d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, out_ptr, N, K, n_steps,
    BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    row, g, at, ok, start = _tile(N, K, BLOCK_N, STEP)
    sb, ib = super_block(row, at, K // 32)
    words, signs, scale = iq3_s_parts(d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, sb, ib)
    _store_points(out_ptr, start, g, ok, words, signs, scale)


@triton.jit
def dequant_iq3_xxs(
    d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, out_ptr, N, K, n_steps,
    BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    row, g, at, ok, start = _tile(N, K, BLOCK_N, STEP)
    sb, ib = super_block(row, at, K // 32)
    words, signs, scale = iq3_xxs_parts(d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, sb, ib)
    _store_points(out_ptr, start, g, ok, words, signs, scale)


@triton.jit
def dequant_iq2_xxs(
    d_ptr, qs_ptr, grid_ptr, ksigns_ptr, out_ptr, N, K, n_steps, BLOCK_N: tl.constexpr, STEP: tl.constexpr
):  # fmt: skip
    row, g, at, ok, start = _tile(N, K, BLOCK_N, STEP)
    sb, ib = super_block(row, at, K // 32)
    words, signs, scale = iq2_xxs_parts(d_ptr, qs_ptr, grid_ptr, ksigns_ptr, sb, ib)
    _store_points(out_ptr, start, g, ok, words, signs, scale)

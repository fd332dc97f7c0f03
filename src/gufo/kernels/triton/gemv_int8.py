"""Skinny products on int8 activations: 4-way integer dot products instead of per-weight float math.

The vector kernels of gemv_kernels.py turn every weight into a float and multiply it, several
instructions per weight (docs/decisions.md, "Decode products on int8 activations"). Here, as in llama.cpp's
CUDA kernels and gufo's CPU backend
(csrc/qgemm_cpu.c), the activations are first quantized per 32 columns to int8 (`quantize_rows_q8`, or
the fused row kernel that produced them: `gufo.kernels.int8_rows`), and a 32-bit
word of weights meets a word of activations in one 4-way integer dot product (`_dot4`). Per 32-column
block (16 for Q6_K's scales) the exact integer sum is scaled once by the weight's and the activations'
scales; offsets (Q4_K's minimums, Q6_K's -32) go through the activation sums.

Formats: Q8_0, Q4_K, Q6_K (what llama-quantize's Q8_0 and Q4_K_M mixes hold), IQ4_NL, IQ4_XS, IQ3_S,
IQ3_XXS and IQ2_XXS (of unsloth's UD mixes), with the weight planes (planes.py) read as int32 words,
launch.py's shapes, split-K and batch invariance (each activation row's arithmetic is the same for any
number of rows).
`_dot4` is PTX dp4a and `_prmt` PTX prmt when compiled for NVIDIA; the Triton interpreter (CI) runs
the same integer arithmetic with shifts and multiplies. AMD keeps the
vector kernels until its dot4 instruction is wired (launch.py chooses).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from gufo.kernels.int8_rows import ACT_BLOCK, Int8Rows, empty_int8_rows
from gufo.kernels.triton.codebook_groups import (
    grid_table,
    iq2_xxs_parts,
    iq3_s_parts,
    iq3_xxs_parts,
    iq4_xs_scale,
    super_block,
)
from gufo.kernels.triton.dependent_launch import DependentLaunch, prefetch_rows, wait_for_inputs
from gufo.kernels.triton.jit_helpers import (
    add_row,
    int8_blocks,
    store_int8_blocks,
    store_partials,
    vector_program,
)

Q = GGMLQuantizationType

QUANT_BLOCKS = 32  # activation blocks per program of the quantizer
# Register cap of the one-row int8 products on 8-row x 2048-column tiles (Q4_K, Q6_K; NVIDIA only, like
# them): one more block per multiprocessor without a spill (`gufo kernels own --target sm_90` checks);
# docs/decisions.md, "Register cap of 72 on one-row int8 tiles"
MAX_REGISTERS = 72
CAPPED_TILE = (1, 8, 2048)  # (BLOCK_M, BLOCK_N, STEP) the cap applies to
CAPPED_FORMATS = (Q.Q4_K, Q.Q6_K)  # the ones it was measured for


@triton.jit
def _row_blocks(x_ptr, stride_xm, K, BLOCKS: tl.constexpr):
    """The BLOCKS 32-column blocks of row pid(0) that program pid(1) handles, as float32 [BLOCKS, 32]
    (zero past K), with their block indices b and which of them exist (ok)."""
    b = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    ok = b < K // 32
    i = tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + tl.program_id(0) * stride_xm + b[:, None] * 32 + i, mask=ok[:, None], other=0.0)
    return x.to(tl.float32), b, ok


@triton.jit
def quantize_rows_q8(x_ptr, xq_ptr, xd_ptr, xs_ptr, K, stride_xm, BLOCKS: tl.constexpr, PDL: tl.constexpr):
    """x [M, K] -> xq int8 [M, K], xd [M, K / 32] scales, xs [M, K / 16] = d * (sum of q) per 16."""
    wait_for_inputs(PDL)
    m = tl.program_id(0)
    n_blocks = K // 32
    x, b, ok = _row_blocks(x_ptr, stride_xm, K, BLOCKS)
    store_int8_blocks(x, b, ok, xq_ptr + m * K, xd_ptr + m * n_blocks, xs_ptr + m * (2 * n_blocks), BLOCKS)


@triton.jit
def round_rows_q8(x_ptr, out_ptr, K, stride_xm, BLOCKS: tl.constexpr):
    """x [M, K] -> out [M, K] in out's dtype: every value as the int8 products multiply it, q * d of
    its 32-column block (`int8_blocks`), so that prefill's tensor-core products see the activations
    that decode's int8 products see."""
    x, b, ok = _row_blocks(x_ptr, stride_xm, K, BLOCKS)
    q, d = int8_blocks(x)
    rounded = (q.to(tl.float32) * d[:, None]).to(out_ptr.dtype.element_ty)
    i = tl.arange(0, 32)[None, :]
    tl.store(out_ptr + tl.program_id(0) * K + b[:, None] * 32 + i, rounded, mask=ok[:, None])


@triton.jit
def _dot4(a, b, NATIVE: tl.constexpr):
    """Per element, the sum of the 4 products of the signed bytes of int32 words a and b."""
    a, b = tl.broadcast(a, b)
    if NATIVE:
        return tl.inline_asm_elementwise(
            "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, tl.zeros_like(a)],
            dtype=tl.int32, is_pure=True, pack=1,
        )  # fmt: skip
    total = tl.zeros_like(a)
    for i in tl.static_range(4):
        total += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
    return total


@triton.jit
def gemv_q8_0_int8(
    xq_ptr, xd_ptr, xs_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # a block = 8 words of weights, 8 words of activations, one scale each
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 4, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 32, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_blocks = K // 32
    j = tl.arange(0, 8)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        blk = step * (STEP // 32) + tl.arange(0, STEP // 32)
        at = tl.minimum(blk, n_blocks - 1)[None, :]  # the tail's clamped blocks meet x = 0
        w = tl.load(qs_ptr + row[:, None, None] * (n_blocks * 8) + at[:, :, None] * 8 + j[None])
        d = tl.load(d_ptr + row[:, None] * n_blocks + at).to(tl.float32)
        for r in tl.static_range(BLOCK_M):
            mr = tl.program_id(2) * BLOCK_M + r
            ok = (blk < n_blocks) & (mr < M)
            x = tl.load(xq_ptr + mr * (K // 4) + blk[:, None] * 8 + j, mask=ok[:, None], other=0)
            xd = tl.load(xd_ptr + mr * n_blocks + blk, mask=ok, other=0.0)
            dots = tl.sum(_dot4(w, x[None], NATIVE), axis=2).to(tl.float32)
            acc = add_row(acc, r, d * xd[None, :] * dots)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def _q4_k_sub_block_scale(w0, w1, w2, shift, high_half):
    """One sub-block's 6-bit (scale, min) as float32 from byte `shift // 8` of each of the 3 scale words."""
    b0, b1, b2 = (w0 >> shift) & 255, (w1 >> shift) & 255, (w2 >> shift) & 255
    scale = tl.where(high_half, (b2 & 15) | ((b0 >> 6) << 4), b0 & 63)
    minimum = tl.where(high_half, (b2 >> 4) | ((b1 >> 6) << 4), b1 & 63)
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _q4_k_chunk_scales(words, c):
    """Q4_K 6-bit (scale, min) of the sub-blocks 2c and 2c + 1 of chunks c (0..3) from a super-block's
    12 scale bytes read as 3 int32 words at `words`: the packing `gemv_kernels._kquant_scale_min` reads
    byte by byte (bytes 0-3 low scales, 4-7 low mins, 8-11 the high sub-blocks' low 4 bits; sub-blocks
    4..7 take their top 2 bits from bytes 0-7), in 3 loads instead of 6."""
    w0, w1, w2 = tl.load(words), tl.load(words + 1), tl.load(words + 2)
    shift = 16 * (c % 2)  # sub-block 2c sits in byte 2 (c % 2) of its words, 2c + 1 in the next
    sc_low, min_low = _q4_k_sub_block_scale(w0, w1, w2, shift, c >= 2)
    sc_high, min_high = _q4_k_sub_block_scale(w0, w1, w2, shift + 8, c >= 2)
    return sc_low, min_low, sc_high, min_high


@triton.jit
def gemv_q4_k_int8(
    xq_ptr, xd_ptr, xs_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, n_steps,
    steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # chunk g (4 per super-block, c = g % 4) = 32 qs bytes = 8 words; byte l holds element 64g + l in
    # its low nibble (sub-block 2c) and 64g + 32 + l in its high nibble (sub-block 2c + 1)
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 8, BLOCK_N)
        prefetch_rows(scales_ptr, N, K // 256 * 3, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 256, BLOCK_N)
        prefetch_rows(dmin_ptr, N, K // 256, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    j = tl.arange(0, 8)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g = step * (STEP // 64) + tl.arange(0, STEP // 64)
        sb = tl.minimum(g // 4, n_super - 1)[None, :]
        c = (g % 4)[None, :]
        w = tl.load(qs_ptr + row[:, None, None] * (n_super * 32) + (sb * 32 + c * 8)[:, :, None] + j[None])
        low = w & 0x0F0F0F0F
        high = (w >> 4) & 0x0F0F0F0F
        d = tl.load(d_ptr + row[:, None] * n_super + sb).to(tl.float32)
        dmin = tl.load(dmin_ptr + row[:, None] * n_super + sb).to(tl.float32)
        scale_words = scales_ptr + row[:, None] * (n_super * 3) + sb * 3
        sc_low, min_low, sc_high, min_high = _q4_k_chunk_scales(scale_words, c)
        for r in tl.static_range(BLOCK_M):
            mr = tl.program_id(2) * BLOCK_M + r
            ok = (g < 4 * n_super) & (mr < M)
            x_at = xq_ptr + mr * (K // 4) + g[:, None] * 16 + j
            x_low = tl.load(x_at, mask=ok[:, None], other=0)
            x_high = tl.load(x_at + 8, mask=ok[:, None], other=0)
            xd_low = tl.load(xd_ptr + mr * (K // 32) + 2 * g, mask=ok, other=0.0)[None, :]
            xd_high = tl.load(xd_ptr + mr * (K // 32) + 2 * g + 1, mask=ok, other=0.0)[None, :]
            xs = xs_ptr + mr * (K // 16) + 4 * g
            xs_low = (tl.load(xs, mask=ok, other=0.0) + tl.load(xs + 1, mask=ok, other=0.0))[None, :]
            xs_high = (tl.load(xs + 2, mask=ok, other=0.0) + tl.load(xs + 3, mask=ok, other=0.0))[None, :]
            dot_low = tl.sum(_dot4(low, x_low[None], NATIVE), axis=2).to(tl.float32)
            dot_high = tl.sum(_dot4(high, x_high[None], NATIVE), axis=2).to(tl.float32)
            scaled = sc_low * xd_low * dot_low + sc_high * xd_high * dot_high
            part = d * scaled - dmin * (min_low * xs_low + min_high * xs_high)
            acc = add_row(acc, r, part)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_q6_k_int8(
    xq_ptr, xd_ptr, xs_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, n_steps,
    steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    # half h of the row (2 per super-block, a = h % 2) = 128 elements: ql words lo = ql[64a + 4j],
    # hi = ql[64a + 32 + 4j], qh words qh[32a + 4j] (j = 4p + jj < 8). Quarter t = 0..3 holds elements
    # 128a + 32t + 4j..: low 4 bits (lo if t is even, else hi) >> 4 (t // 2), high 2 bits qh >> 2t; value
    # q - 32 with q in 0..63, scale index 8a + 2t + p (16 elements each)
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(ql_ptr, N, K // 8, BLOCK_N)
        prefetch_rows(qh_ptr, N, K // 16, BLOCK_N)
        prefetch_rows(scales_ptr, N, K // 16, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 256, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    pair = tl.arange(0, 2)[None, :]  # p
    word = pair[:, :, None] * 4 + tl.arange(0, 4)[None, None, :]  # [1, 2, 4]: j
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        h = step * (STEP // 128) + tl.arange(0, STEP // 128)
        sb = tl.minimum(h // 2, n_super - 1)
        a = h % 2
        ql = (
            ql_ptr
            + row[:, None, None, None] * (n_super * 32)
            + (sb * 32 + a * 16)[None, :, None, None]
            + word[None]
        )
        lo, hi = tl.load(ql), tl.load(ql + 8)
        qh_at = (sb * 16 + a * 8)[None, :, None, None] + word[None]
        qh = tl.load(qh_ptr + row[:, None, None, None] * (n_super * 16) + qh_at)
        d = tl.load(d_ptr + row[:, None] * n_super + sb[None, :]).to(tl.float32)  # [BLOCK_N, halves]
        scales = (
            scales_ptr + row[:, None, None] * (n_super * 16) + (sb * 16 + a * 8)[None, :, None] + pair[None]
        )
        for t in tl.static_range(4):
            bits = lo if t % 2 == 0 else hi
            q = ((bits >> (4 * (t // 2))) & 0x0F0F0F0F) | (((qh >> (2 * t)) & 0x03030303) << 4)
            sc = tl.load(scales + 2 * t).to(tl.float32)  # [BLOCK_N, halves, 2]
            for r in tl.static_range(BLOCK_M):
                mr = tl.program_id(2) * BLOCK_M + r
                ok = (h < 2 * n_super) & (mr < M)
                x_at = xq_ptr + mr * (K // 4) + (h * 32 + 8 * t)[:, None, None] + word
                x = tl.load(x_at, mask=ok[:, None, None], other=0)  # [halves, 2, 4]
                xd = tl.load(xd_ptr + mr * (K // 32) + 4 * h + t, mask=ok, other=0.0)[None, :, None]
                xs_at = xs_ptr + mr * (K // 16) + (8 * h + 2 * t)[:, None] + pair
                xs = tl.load(xs_at, mask=ok[:, None], other=0.0)[None]  # [1, halves, 2]
                dots = tl.sum(_dot4(q, x[None], NATIVE), axis=3).to(tl.float32)  # [BLOCK_N, halves, 2]
                part = sc * (xd * dots - 32.0 * xs)
                acc = add_row(acc, r, d * tl.sum(part, axis=2))
    store_partials(out_ptr, acc, m, n, M, N, split)


# --------------------------------------------------------------------------------------------------
# IQ4_NL / IQ4_XS: a word of 8 4-bit level indices becomes two words of int8 levels with byte
# permutes (`_levels_16`, llama.cpp's get_int_from_table_16: the 16 levels held in 4 registers), no
# table reads in the loop.


@triton.jit
def _prmt(a, b, selector, NATIVE: tl.constexpr):
    """Byte i of the result = byte (nibble i of selector) of the 8-byte pair b:a (0..3 from a, 4..7 from
    b); every selector nibble under 8 (PTX prmt.b32 would replicate sign bits otherwise)."""
    zero = (a & 0) + (b & 0) + (selector & 0)  # the three broadcast to one shape (a constant selector too)
    a, b, selector = a + zero, b + zero, selector + zero
    if NATIVE:
        return tl.inline_asm_elementwise(
            "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, selector], dtype=tl.int32, is_pure=True, pack=1
        )
    i = tl.arange(0, 4)  # the 4 result bytes along a new last axis
    pick = ((tl.expand_dims(selector, -1) >> (4 * i)) & 7).to(tl.int64)
    pair = tl.expand_dims((b.to(tl.int64) << 32) | a.to(tl.uint32).to(tl.int64), -1)
    return tl.sum(((pair >> (8 * pick)) & 255) << (8 * i), axis=len(pick.shape) - 1).to(tl.int32)


@triton.jit
def _level_word(levels_ptr, w):
    """Levels 4w..4w + 3 of the float32 table as one word of 4 int8 (level 4w in the low byte)."""
    word = tl.load(levels_ptr + 4 * w).to(tl.int32) & 255
    for i in tl.static_range(1, 4):
        word |= (tl.load(levels_ptr + 4 * w + i).to(tl.int32) & 255) << (8 * i)
    return word


@triton.jit
def _levels_16(q4, t0, t1, t2, t3, NATIVE: tl.constexpr):
    """int32 words q4 of 4 bytes, byte i = elements i (low nibble) and 4 + i (high) of 8, as level
    indices -> their int8 levels in the nibbles' order, elements (0, 4, 1, 5) and (2, 6, 3, 7): the
    activations are permuted to match (`_level_products`), once for all rows; t0..t3 the 16 levels."""
    # per nibble: 4 * (bit 3) + its position, choosing between the lookups of levels 0..7 and 8..15
    choose = ((q4 >> 1) & 0x44444444) | 0x32103210
    first = q4 & 0x7777
    pair_0 = _prmt(_prmt(t0, t1, first, NATIVE), _prmt(t2, t3, first, NATIVE), choose, NATIVE)
    second = (q4 >> 16) & 0x7777
    pair_1 = _prmt(_prmt(t0, t1, second, NATIVE), _prmt(t2, t3, second, NATIVE), choose >> 16, NATIVE)
    return pair_0, pair_1


@triton.jit
def _level_products(acc, q4, scale, levels_ptr, xq_ptr, xd_ptr, g, M, K, BLOCK_M: tl.constexpr,
                    NATIVE: tl.constexpr):  # fmt: skip
    """acc[r] += scale * xd * (levels . xq) per group g of 32: q4 [BLOCK_N, G, 4] the group's 16 bytes
    as words, byte 4t + i holding element 4t + i (low nibble) and 16 + 4t + i (high)."""
    pair_0, pair_1 = _levels_16(
        q4, _level_word(levels_ptr, 0), _level_word(levels_ptr, 1), _level_word(levels_ptr, 2),
        _level_word(levels_ptr, 3), NATIVE,
    )  # fmt: skip
    t = tl.arange(0, 4)[None, :]
    for r in tl.static_range(BLOCK_M):
        mr = tl.program_id(2) * BLOCK_M + r
        ok = (g < K // 32) & (mr < M)
        x_at = xq_ptr + mr * (K // 4) + g[:, None] * 8 + t
        x_low = tl.load(x_at, mask=ok[:, None], other=0)  # elements 4t..4t + 3
        x_high = tl.load(x_at + 4, mask=ok[:, None], other=0)  # 16 + 4t..
        # in the levels' order: (4t, 16 + 4t, 4t + 1, 17 + 4t), (4t + 2, 18 + 4t, 4t + 3, 19 + 4t)
        x_0 = _prmt(x_low, x_high, 0x5140, NATIVE)
        x_1 = _prmt(x_low, x_high, 0x7362, NATIVE)
        xd = tl.load(xd_ptr + mr * (K // 32) + g, mask=ok, other=0.0)[None, :]
        dots = tl.sum(_dot4(pair_0, x_0[None], NATIVE) + _dot4(pair_1, x_1[None], NATIVE), axis=2)
        acc = add_row(acc, r, scale * xd * dots.to(tl.float32))
    return acc


@triton.jit
def gemv_iq4_nl_int8(
    xq_ptr, xd_ptr, xs_ptr, qs_ptr, d_ptr, levels_ptr, out_ptr, M, N, K, n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 8, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 32, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g = step * (STEP // 32) + tl.arange(0, STEP // 32)
        at = row[:, None] * (K // 32) + tl.minimum(g, K // 32 - 1)[None, :]  # the tail's meet x = 0
        q4 = tl.load(qs_ptr + at[:, :, None] * 4 + tl.arange(0, 4)[None, None, :])
        scale = tl.load(d_ptr + at).to(tl.float32)
        acc = _level_products(acc, q4, scale, levels_ptr, xq_ptr, xd_ptr, g, M, K, BLOCK_M, NATIVE)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq4_xs_int8(
    xq_ptr, xd_ptr, xs_ptr, d_ptr, scales_h_ptr, scales_l_ptr, qs_ptr, levels_ptr, out_ptr, M, N, K,
    n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 8, BLOCK_N)
        prefetch_rows(scales_l_ptr, N, K // 64, BLOCK_N)
        prefetch_rows(scales_h_ptr, N, K // 256, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 256, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        g = step * (STEP // 32) + tl.arange(0, STEP // 32)
        sb, ib = super_block(row, tl.minimum(g, K // 32 - 1), K // 32)  # the tail's meet x = 0
        q4 = tl.load(qs_ptr + (sb * 32 + ib * 4)[:, :, None] + tl.arange(0, 4)[None, None, :])
        scale = iq4_xs_scale(d_ptr, scales_h_ptr, scales_l_ptr, sb, ib)
        acc = _level_products(acc, q4, scale, levels_ptr, xq_ptr, xd_ptr, g, M, K, BLOCK_M, NATIVE)
    store_partials(out_ptr, acc, m, n, M, N, split)


# --------------------------------------------------------------------------------------------------
# IQ3_S / IQ3_XXS / IQ2_XXS: the lattice points are read from their grid as int32 words of 4 int8
# values (all 1..62, gemv_kernels.iq3_s_parts), and signed in the word: a negated byte v becomes
# (v ^ 0xFF) + 1, which never carries into the next byte since v > 0.


@triton.jit
def _signed_words(words, signs):
    """words [BLOCK_N, G, 8] of lattice values with the signs of sign bytes [BLOCK_N, G, 4] (bit j of
    byte l: element 8l + j, so word 2l + h takes bits 4h..4h + 3 of byte l, one per byte)."""
    h = tl.arange(0, 2)[None, None, None, :]
    bits = tl.reshape((signs[:, :, :, None].to(tl.int32) >> (4 * h)) & 15, words.shape)
    ones = (bits * 0x00204081) & 0x01010101  # bit i of the 4 to the low bit of byte i
    return (words ^ (ones * 255)) + ones


@triton.jit
def _lattice_products(acc, words, signs, scale, xq_ptr, xd_ptr, g, M, K, BLOCK_M: tl.constexpr,
                      NATIVE: tl.constexpr):  # fmt: skip
    """acc[r] += scale * xd * (signed lattice values . xq) per group g of 32 (`_signed_words`)."""
    w = _signed_words(words, signs)
    j = tl.arange(0, 8)[None, :]
    for r in tl.static_range(BLOCK_M):
        mr = tl.program_id(2) * BLOCK_M + r
        ok = (g < K // 32) & (mr < M)
        x = tl.load(xq_ptr + mr * (K // 4) + g[:, None] * 8 + j, mask=ok[:, None], other=0)
        xd = tl.load(xd_ptr + mr * (K // 32) + g, mask=ok, other=0.0)[None, :]
        dots = tl.sum(_dot4(w, x[None], NATIVE), axis=2).to(tl.float32)
        acc = add_row(acc, r, scale * xd * dots)
    return acc


@triton.jit
def gemv_iq3_s_int8(
    xq_ptr, xd_ptr, xs_ptr, d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, out_ptr, M, N, K,
    n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, QS_WORDS: tl.constexpr, SHARED_GRID: tl.constexpr,
    INDEXED: tl.constexpr = False,
):  # fmt: skip
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 4, BLOCK_N)
        prefetch_rows(qh_ptr, N, K // 32, BLOCK_N)
        prefetch_rows(signs_ptr, N, K // 8, BLOCK_N)
        prefetch_rows(scales_ptr, N, K // 64, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 256, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    grid = grid_table(grid_ptr, 512, SHARED_GRID)
    for step in range(first, last):
        g = step * (STEP // 32) + tl.arange(0, STEP // 32)
        sb, ib = super_block(row, tl.minimum(g, K // 32 - 1), K // 32)  # the tail's meet x = 0
        words, signs, scale = iq3_s_parts(
            d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid, sb, ib, QS_WORDS, SHARED_GRID
        )
        acc = _lattice_products(acc, words, signs, scale, xq_ptr, xd_ptr, g, M, K, BLOCK_M, NATIVE)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq3_xxs_int8(
    xq_ptr, xd_ptr, xs_ptr, d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K,
    n_steps, steps_per_split, ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, QS_WORDS: tl.constexpr, PARITY_SIGNS: tl.constexpr,
    SHARED_GRID: tl.constexpr, INDEXED: tl.constexpr = False,
):  # fmt: skip
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 4, BLOCK_N)
        prefetch_rows(aux_ptr, N, K // 32, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 256, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    grid = grid_table(grid_ptr, 256, SHARED_GRID)
    for step in range(first, last):
        g = step * (STEP // 32) + tl.arange(0, STEP // 32)
        sb, ib = super_block(row, tl.minimum(g, K // 32 - 1), K // 32)  # the tail's meet x = 0
        words, signs, scale = iq3_xxs_parts(
            d_ptr, qs_ptr, aux_ptr, grid, ksigns_ptr, sb, ib, QS_WORDS, PARITY_SIGNS, SHARED_GRID
        )
        acc = _lattice_products(acc, words, signs, scale, xq_ptr, xd_ptr, g, M, K, BLOCK_M, NATIVE)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def gemv_iq2_xxs_int8(
    xq_ptr, xd_ptr, xs_ptr, d_ptr, qs_ptr, grid_ptr, ksigns_ptr, out_ptr, M, N, K, n_steps, steps_per_split,
    ids_ptr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, NATIVE: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, PARITY_SIGNS: tl.constexpr, WIDE_GRID: tl.constexpr,
    SHARED_GRID: tl.constexpr, INDEXED: tl.constexpr = False,
):  # fmt: skip
    if PREFETCH and tl.num_programs(1) == 1:  # whole rows: the weights, before waiting for x
        prefetch_rows(qs_ptr, N, K // 16, BLOCK_N)
        prefetch_rows(d_ptr, N, K // 256, BLOCK_N)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, ids_ptr, INDEXED)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    grid = grid_table(grid_ptr, 256 if WIDE_GRID else 512, SHARED_GRID)  # 256 points, 8 bytes each
    for step in range(first, last):
        g = step * (STEP // 32) + tl.arange(0, STEP // 32)
        sb, ib = super_block(row, tl.minimum(g, K // 32 - 1), K // 32)  # the tail's meet x = 0
        words, signs, scale = iq2_xxs_parts(
            d_ptr, qs_ptr, grid, ksigns_ptr, sb, ib, PARITY_SIGNS, WIDE_GRID, SHARED_GRID
        )
        acc = _lattice_products(acc, words, signs, scale, xq_ptr, xd_ptr, g, M, K, BLOCK_M, NATIVE)
    store_partials(out_ptr, acc, m, n, M, N, split)


@dataclass(frozen=True)
class Decoding:
    """How the lattice formats' kernels decode (their constexprs; all off: the measured defaults, and
    the only setting of the other formats). Alternatives that the bandwidth sweep times
    (scripts/gemv_bandwidth.py --sweep), each giving the same values."""

    qs_words: bool = False  # IQ3_S, IQ3_XXS: grid indices (IQ3_S: and sign bytes) read as int32 words
    parity_signs: bool = False  # IQ3_XXS, IQ2_XXS: sign bytes from their index's parity, no ksigns reads
    wide_grid: bool = False  # IQ2_XXS: a grid point's 8 values read as one int64, not two int32
    # the lattice formats: the grid loaded once per program and its entries gathered (tl.gather: from
    # shared memory) instead of loaded from global memory through L1 at every K step
    shared_grid: bool = False


# per format, its kernel's Decoding switches (constexpr = the field's name in capitals)
DECODING = {
    Q.IQ3_S: ("qs_words", "shared_grid"),
    Q.IQ3_XXS: ("qs_words", "parity_signs", "shared_grid"),
    Q.IQ2_XXS: ("parity_signs", "wide_grid", "shared_grid"),
}
# planes.py planes that the switch reads as int32 (qs_words) or int64 (wide_grid: the grid table)
SWITCH_PLANES = {
    ("qs_words", Q.IQ3_S): ((1, 3), torch.int32),
    ("qs_words", Q.IQ3_XXS): ((1,), torch.int32),
    ("wide_grid", Q.IQ2_XXS): ((2,), torch.int64),
}


def decoding_constexprs(qtype: GGMLQuantizationType, decoding: Decoding) -> dict[str, bool]:
    """The kernel's switch constexprs; raises naming a switch the format's kernel does not have."""
    taken = DECODING.get(qtype, ())
    for switch in fields(Decoding):
        if getattr(decoding, switch.name) and switch.name not in taken:
            raise ValueError(f"decoding switch {switch.name} on {qtype.name}, whose int8 kernel has none")
    return {name.upper(): getattr(decoding, name) for name in taken}


def _viewed(
    qtype: GGMLQuantizationType, planes: tuple[torch.Tensor, ...], decoding: Decoding
) -> tuple[torch.Tensor, ...]:
    """The planes as the kernel reads them: WORD_PLANES as int32, then the switches' views."""
    words = WORD_PLANES.get(qtype, ())
    viewed = [p.view(torch.int32) if i in words else p for i, p in enumerate(planes)]
    for (name, format_), (indices, dtype) in SWITCH_PLANES.items():
        if format_ == qtype and getattr(decoding, name):
            for i in indices:
                viewed[i] = viewed[i].view(dtype)
    return tuple(viewed)


KERNELS = {
    Q.Q8_0: gemv_q8_0_int8,
    Q.Q4_K: gemv_q4_k_int8,
    Q.Q6_K: gemv_q6_k_int8,
    Q.IQ4_NL: gemv_iq4_nl_int8,
    Q.IQ4_XS: gemv_iq4_xs_int8,
    Q.IQ3_S: gemv_iq3_s_int8,
    Q.IQ3_XXS: gemv_iq3_xxs_int8,
    Q.IQ2_XXS: gemv_iq2_xxs_int8,
}
# planes.py planes of bytes, read as int32
WORD_PLANES = {
    Q.Q8_0: (0,),
    Q.Q4_K: (2, 3),
    Q.Q6_K: (0, 1),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (3,),
}  # planes.py planes of bytes, read as int32


def native() -> bool:
    """Whether `_dot4` compiles to dp4a: compiled kernels (launch.py sends only NVIDIA here), not the
    Triton interpreter, which runs the shift-and-multiply form."""
    return not triton.knobs.runtime.interpret


def _row_blocks_grid(x: torch.Tensor) -> tuple[int, int]:
    """Programs of the kernels built on `_row_blocks` for x [M, K]: one row x QUANT_BLOCKS blocks each."""
    m, k = x.shape
    return m, triton.cdiv(k // ACT_BLOCK, QUANT_BLOCKS)


def quantize_rows(x: torch.Tensor, launch: DependentLaunch) -> Int8Rows:
    """`quantize_rows_q8` on x [M, K] (K a multiple of 32, unit column stride)."""
    m, k = x.shape
    rows = empty_int8_rows(m, k, x.device)
    # no fused multiply-add: see int8_blocks
    quantize_rows_q8[_row_blocks_grid(x)](
        x, *rows, k, x.stride(0), BLOCKS=QUANT_BLOCKS, num_warps=4, enable_fp_fusion=False,
        **launch.options(x.device),
    )  # fmt: skip
    return rows


def round_rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`round_rows_q8` on x [M, K] (K a multiple of 32, unit column stride): [M, K] in dtype."""
    m, k = x.shape
    out = torch.empty(m, k, dtype=dtype, device=x.device)
    # no fused multiply-add: see int8_blocks
    round_rows_q8[_row_blocks_grid(x)](
        x, out, k, x.stride(0), BLOCKS=QUANT_BLOCKS, num_warps=4, enable_fp_fusion=False
    )
    return out


def launch(
    x: torch.Tensor | Int8Rows,
    qtype: GGMLQuantizationType,
    planes: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    grid: tuple[int, int, int],
    n_steps: int,
    per_split: int,
    block_m: int,
    block_n: int,
    step: int,
    warps: int,
    launch: DependentLaunch,
    decoding: Decoding = Decoding(),
    ids: torch.Tensor | None = None,
) -> None:
    """out[split, m, n] of x [M, K] (float32 rows, or rows a fused kernel quantized already) and a
    weight's planes (planes.py), on int8 activations (see launch.gemv), decoded as `decoding` says; with
    expert `ids`, the expert-indexed product (launch.ExpertRows), which prefetches nothing: its programs'
    rows are not the rows `prefetch_rows` names."""
    m, k = x.shape
    switches = decoding_constexprs(qtype, decoding)
    xq, xd, xs = x if isinstance(x, Int8Rows) else quantize_rows(x, launch)
    words = _viewed(qtype, planes, decoding)
    weight_bytes = sum(p.numel() * p.element_size() for p in planes)
    capped = qtype in CAPPED_FORMATS and (block_m, block_n, step) == CAPPED_TILE
    KERNELS[qtype][grid](
        xq.view(torch.int32), xd, xs, *words, out, m, out.shape[-1], k, n_steps, per_split, ids,
        BLOCK_M=block_m, BLOCK_N=block_n, STEP=step, NATIVE=native(), num_warps=warps,
        enable_fp_fusion=False, PREFETCH=ids is None and launch.prefetches(out.device, weight_bytes),
        maxnreg=MAX_REGISTERS if capped else None, **switches,
        **launch.options(out.device), **({} if ids is None else {"INDEXED": True}),
    )  # fmt: skip
    # Without fused multiply-adds every row rounds the same way in any row tile: with them, some Q4_K
    # rows of a 10-row product differed from the same rows alone on the H200 (batch invariance lost).

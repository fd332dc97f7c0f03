"""Decode products of 1..MAX_TENSOR_ROWS int8 activation rows on the tensor cores (Q4_K, Q6_K, Q8_0).

The vector kernels of gemv_int8.py repeat every 4-way dot product once per activation row, so at 16
rows they are bound by arithmetic (docs/decisions.md, "Tensor-core decode rows"). Here the weights of
one 32-column block are unpacked once to int8 [32, BLOCK_N] in registers and meet a fixed tile of
BLOCK_M = 16 activation rows (rows past M are zero) in one integer `tl.dot`: the exact int32 sums of
the block for all 16 rows. The float part then scales and accumulates them block after block, in the
same order and with the same instructions for every row: per block and row, (activation scale x
weight scale) x sum; Q4_K's minimums through the activation sums, as in gemv_int8. Q6_K instead
meets float16 operands: each 32-column block of weights dequantized once for the tile's rows (d x
scale x (q - 32), rounded to float16 as prefill's dequantizer rounds it), the rows' int8 values times
their scale rounded to float16, and the MMA accumulates in float32, so no float work per output and
block is left (1.00-1.15x the int8 tile at 1-16 rows, 1.25-1.39x at 32-64 on the H200: docs/decisions.md,
"Tensor-core decode rows"). A row's result depends on that row alone: never on the other rows, M, or
which tile along M holds it, as every tile is BLOCK_M rows whatever M is (batch invariance by
construction). The split of K depends on the output tiles only (launch._splits). The float part runs
on all 16 rows of a tile whatever M is, so it is kept to a few full-rate instructions per tile element
(`_exact_float`, `_block_product`).

It is not bit-identical to the vector kernels (their sums run in another order): the engine takes one
route for all its decode products (KernelOptions.row_products), so its output never depends on how
many rows share a step. NVIDIA only, like the other tensor-core tiles (launch.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.triton.gemv_int8 import _q4_k_chunk_scales
from gufo.kernels.triton.jit_helpers import store_partials, vector_program

Q = GGMLQuantizationType

BLOCK_M = 16  # activation rows per tile, whatever M is (the smallest int8 tensor-core tile)
MAX_TENSOR_ROWS = 64  # most rows per product on this route (decode rows; the tile repeats along M)


@triton.jit
def _x_block(xq_ptr, xd_ptr, m, M, K, blk):
    """The activation tile of 32-column block blk: int8 [BLOCK_M, 32] (rows past M zero) and the
    rows' scales [BLOCK_M, 1]."""
    i = tl.arange(0, 32)[None, :]
    ok = m < M
    x = tl.load(xq_ptr + m[:, None] * K + blk * 32 + i, mask=ok[:, None], other=0)
    xd = tl.load(xd_ptr + m * (K // 32) + blk, mask=ok, other=0.0)
    return x, xd[:, None]


@triton.jit
def _x_sums(xs_ptr, m, M, K, group):
    """The activation sums (scale * sum of values) of 16-column group `group`: [BLOCK_M, 1]."""
    return tl.load(xs_ptr + m * (K // 16) + group, mask=m < M, other=0.0)[:, None]


@triton.jit
def _exact_float(dots):
    """int32 dots (|dots| < 2^22) as float32, exactly: added to the bits of 1.5 * 2^23 and subtracted in
    float, two full-rate instructions instead of a quarter-rate conversion."""
    return (dots + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _block_product(acc, x, xd, w, w_scale):
    """acc + (xd * w_scale) * (x . w): x int8 [BLOCK_M, 32] with its rows' scales xd [BLOCK_M, 1], w
    int8 [32, BLOCK_N] with its rows' scales w_scale [BLOCK_N]; |sums| < 2^22."""
    dots = _exact_float(tl.dot(x, w, out_dtype=tl.int32))
    return acc + (xd * w_scale[None, :]) * dots


@triton.jit
def rows_q8_0_int8(
    xq_ptr, xd_ptr, xs_ptr, qs_ptr, d_ptr, out_ptr, M, N, K, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, None, False)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_blocks = K // 32
    i = tl.arange(0, 32)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        for s in tl.static_range(STEP // 32):
            blk = step * (STEP // 32) + s
            at = tl.minimum(blk, n_blocks - 1)  # the tail's clamped block meets x = 0
            w = tl.load(
                qs_ptr + row[None, :] * K + at * 32 + i
            )  # int8 [32, BLOCK_N], |sums| <= 32 * 127 * 128
            d = tl.load(d_ptr + row * n_blocks + at).to(tl.float32)
            x, xd = _x_block(xq_ptr, xd_ptr, m, tl.where(blk < n_blocks, M, 0), K, blk)
            acc = _block_product(acc, x, xd, w, d)
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def rows_q4_k_int8(
    xq_ptr, xd_ptr, xs_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, n_steps,
    steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # chunk c of a super-block: 32 qs bytes, byte l holding element 64c + l in its low nibble (sub-block
    # 2c) and 64c + 32 + l in its high nibble (sub-block 2c + 1); value d * scale * q - dmin * min
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, None, False)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    i = tl.arange(0, 32)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        for s in tl.static_range(STEP // 256):
            sb = step * (STEP // 256) + s  # K is a multiple of STEP: no tail
            d = tl.load(d_ptr + row * n_super + sb).to(tl.float32)
            dmin = tl.load(dmin_ptr + row * n_super + sb).to(tl.float32)
            for c in tl.static_range(4):
                w = tl.load(qs_ptr + row[None, :] * (n_super * 128) + sb * 128 + c * 32 + i)  # uint8
                scale_words = scales_ptr + row * (n_super * 3) + sb * 3
                sc_low, min_low, sc_high, min_high = _q4_k_chunk_scales(scale_words, c)
                for half in tl.static_range(2):  # the low nibbles (sub-block 2c), then the high ones
                    blk = 8 * sb + 2 * c + half
                    q = ((w >> (4 * half)) & 15).to(tl.int8)  # |sums| <= 32 * 127 * 15
                    x, xd = _x_block(xq_ptr, xd_ptr, m, M, K, blk)
                    sc, minimum = (sc_high, min_high) if half else (sc_low, min_low)
                    acc = _block_product(acc, x, xd, q, d * sc)
                    xs = _x_sums(xs_ptr, m, M, K, 2 * blk) + _x_sums(xs_ptr, m, M, K, 2 * blk + 1)
                    acc -= (dmin * minimum)[None, :] * xs
    store_partials(out_ptr, acc, m, n, M, N, split)


@triton.jit
def rows_q6_k_f16(
    xq_ptr, xd_ptr, xs_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, M, N, K, n_steps,
    steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # half a of a super-block = 128 elements; its quarter t = elements 128a + 32t + l: low 4 bits from
    # ql[64a + l] (t even) or ql[64a + 32 + l] (t odd), >> 4 (t // 2); high 2 bits qh[32a + l] >> 2t;
    # value d * scale * (q - 32), q in 0..63, scales per 16 columns (index 8a + 2t + (l >= 16)). Each
    # 32-column block of weights is dequantized to float16 once for the tile's rows and the rows' int8
    # values times their scale rounded to float16: the MMA accumulates in float32, no float work per
    # output and block (xs_ptr, the activation sums, is not read)
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, PDL, None, False)
    m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    n_super = K // 256
    i = tl.arange(0, 32)
    first_half = (i < 16)[:, None]  # of a block's columns: the first 16-column scale's
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        for s in tl.static_range(STEP // 256):
            sb = step * (STEP // 256) + s  # K is a multiple of STEP: no tail
            d = tl.load(d_ptr + row * n_super + sb).to(tl.float32)
            for a in tl.static_range(2):
                ql = ql_ptr + row[None, :] * (n_super * 128) + sb * 128 + 64 * a + i[:, None]
                lo, hi = tl.load(ql), tl.load(ql + 32)  # uint8 [32, BLOCK_N]
                qh = tl.load(qh_ptr + row[None, :] * (n_super * 64) + sb * 64 + 32 * a + i[:, None])
                scales = scales_ptr + row * (n_super * 16) + sb * 16 + 8 * a
                for t in tl.static_range(4):
                    bits = lo if t % 2 == 0 else hi
                    q = (((bits >> (4 * (t // 2))) & 15) | (((qh >> (2 * t)) & 3) << 4)).to(tl.float32) - 32.0
                    sc_0 = tl.load(scales + 2 * t).to(tl.float32)
                    sc_1 = tl.load(scales + 2 * t + 1).to(tl.float32)
                    scale = tl.where(first_half, (d * sc_0)[None, :], (d * sc_1)[None, :])
                    x, xd = _x_block(xq_ptr, xd_ptr, m, M, K, sb * 8 + 4 * a + t)
                    acc = tl.dot((x.to(tl.float32) * xd).to(tl.float16), (q * scale).to(tl.float16), acc)
    store_partials(out_ptr, acc, m, n, M, N, split)


KERNELS = {Q.Q8_0: rows_q8_0_int8, Q.Q4_K: rows_q4_k_int8, Q.Q6_K: rows_q6_k_f16}
SCALE_WORDS = {Q.Q4_K: 2}  # planes read as int32 words (Q4_K's packed scales, `_q4_k_chunk_scales`)


def launch(
    x: Int8Rows,
    qtype: GGMLQuantizationType,
    planes: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    grid: tuple[int, int, int],
    n_steps: int,
    per_split: int,
    block_n: int,
    step: int,
    warps: int,
    options: dict[str, bool],
) -> None:
    """out[split, m, n] of int8 rows x [M, K] and a weight's planes (planes.py); grid (output tiles,
    splits, row tiles of BLOCK_M); `options` the dependent-launch ones (DependentLaunch.options)."""
    m, k = x.shape
    xq, xd, xs = x
    words = tuple(p.view(torch.int32) if i == SCALE_WORDS.get(qtype) else p for i, p in enumerate(planes))
    KERNELS[qtype][grid](
        xq, xd, xs, *words, out, m, out.shape[-1], k, n_steps, per_split,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, STEP=step, num_warps=warps, enable_fp_fusion=False, **options,
    )  # fmt: skip
    # no fused multiply-adds, as in gemv_int8 (docs/decisions.md, "No fused multiply-adds in the int8
    # products"): the float part rounds the same way in every compiled variant

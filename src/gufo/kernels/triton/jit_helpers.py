"""@triton.jit helpers shared by several kernel modules: the skinny products' program layout and partial
sums (gemv_kernels, gemv_int8), and the int8 activation blocks every row kernel that feeds an int8
product writes (gemv_int8, elementwise, attention), rounded exactly as `gufo.kernels.int8_rows`."""

from __future__ import annotations

import triton
import triton.language as tl

from gufo.kernels.triton.dependent_launch import wait_for_inputs


@triton.jit
def store_partials(out_ptr, acc, m, n, M, N, split):
    """out[split, m, n] = acc (converted to out's dtype)."""
    rows = (split * M + m[:, None]).to(tl.int64)
    tl.store(out_ptr + rows * N + n[None, :], acc, mask=(m < M)[:, None] & (n < N)[None, :])


@triton.jit
def vector_program(
    N, n_steps, steps_per_split, BLOCK_N: tl.constexpr, PDL: tl.constexpr, ids_ptr, INDEXED: tl.constexpr
):
    """Output rows n, their weight rows (rows past N read row 0: in bounds, never stored), the split
    index and its K-step range [first, last); first waits for the kernel before (dependent_launch).

    INDEXED (expert-indexed products, launch.ExpertRows): the weight is a stack of experts of N rows
    each, and program pid(2) computes activation row pid(2) (BLOCK_M = 1) against expert ids[pid(2)],
    whose rows are read in place: the weight rows are offset by that expert's first row."""
    wait_for_inputs(PDL)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row = tl.where(n < N, n, 0).to(tl.int64)
    if INDEXED:
        row += tl.load(ids_ptr + tl.program_id(2)).to(tl.int64) * N
    split = tl.program_id(1)
    first = split * steps_per_split
    return n, row, split, first, tl.minimum(first + steps_per_split, n_steps)


@triton.jit
def add_row(acc, i, part):
    """acc[i, :] += sum of part [BLOCK_N, groups] over its groups."""
    rows = tl.arange(0, acc.shape[0])[:, None]
    return tl.where(rows == i, acc + tl.sum(part, axis=1)[None, :], acc)


@triton.jit
def int8_blocks(x):
    """x [BLOCKS, 32] (float32) quantized per block as the oracle does: (q int32 [BLOCKS, 32] in
    -127..127, d [BLOCKS]). The caller compiles without fused multiply-adds: x * (1 / d) must round
    before the rounding to an integer, as in the oracle."""
    # correctly rounded divisions (Triton's `/` on float32 may be approximate), as the oracle divides
    d = tl.math.div_rn(tl.max(tl.abs(x), axis=1), 127.0)
    inverse = tl.where(d != 0.0, tl.math.div_rn(1.0, tl.where(d != 0.0, d, 1.0)), 0.0)
    # |x / d| <= 127: adding and subtracting 1.5 * 2^23 rounds to the nearest integer, ties to even
    q = ((x * inverse[:, None] + 12582912.0) - 12582912.0).to(tl.int32)
    return q, d


@triton.jit
def store_int8_blocks(x, b, ok, xq_row, xd_row, xs_row, BLOCKS: tl.constexpr):
    """Quantize x [BLOCKS, 32] (float32, the row's blocks b [BLOCKS], valid where ok; `int8_blocks`)
    and store them as `Int8Rows` (gufo.kernels.int8_rows): int8 values at xq_row, scales at xd_row,
    sums at xs_row."""
    i = tl.arange(0, 32)[None, :]
    q, d = int8_blocks(x)
    tl.store(xq_row + b[:, None] * 32 + i, q.to(tl.int8), mask=ok[:, None])
    tl.store(xd_row + b, d, mask=ok)
    sums = tl.sum(tl.reshape(q, (BLOCKS, 2, 16)), axis=2).to(tl.float32)
    half = tl.arange(0, 2)[None, :]
    tl.store(xs_row + b[:, None] * 2 + half, d[:, None] * sums, mask=ok[:, None])


@triton.jit
def store_int8_row(y, row, first, F, xq_ptr, xd_ptr, xs_ptr, BLOCK: tl.constexpr):
    """`store_int8_blocks` of y ([BLOCK] float32: columns first.. of row `row` of F columns; `first`
    and F multiples of 32) into `Int8Rows` at xq_ptr, xd_ptr, xs_ptr."""
    b = first // 32 + tl.arange(0, BLOCK // 32)
    per_row = F // 32
    rows = (xq_ptr + row * F, xd_ptr + row * per_row, xs_ptr + row * (2 * per_row))
    store_int8_blocks(tl.reshape(y, (BLOCK // 32, 32)), b, b < per_row, *rows, BLOCK // 32)

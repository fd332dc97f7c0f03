"""Decode products of 1..MAX_HALF_ROWS rows on float16 weights held dequantized on the device
(KernelOptions.row_products = "f16").

The quantized products of many rows are bound by unpacking each weight block once per row tile
(docs/decisions.md, "Tensor-core decode rows"); here the weights were dequantized to float16 once, at
load, so a tile of BLOCK_M = 64 activation rows (rows past M are zero) meets [STEP, BLOCK_N] of them in
one float16 `tl.dot` with float32 accumulation. The tile is that tall whatever M is: against a 16-row
tile a step of one or 16 rows costs more, one of 48 or 64 rows less, which is what this route is for;
more rows than 64 a product cost as much per row again, so decode steps stop at one tile and longer
prefill chunks take cuBLAS (measured: docs/decisions.md, "Float16 decode rows"). A row's numbers depend
on that row alone: every tile is BLOCK_M rows whatever M is, its activations are rounded to float16 one
by one, and the split of K depends on the output tiles only (`launch._splits`), so M rows give each row
its M = 1 numbers (batch invariance by construction). `M` is not specialised, so a one-row product
compiles to the same code as any other.

Not the numbers of the quantized routes (their activations are int8): the engine takes one route for all
its products (KernelOptions.row_products). NVIDIA only, like the other tensor-core tiles (launch.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from gufo.kernels.triton.dependent_launch import wait_for_inputs
from gufo.kernels.triton.jit_helpers import store_partials

Q = GGMLQuantizationType

BLOCK_M = 64  # activation rows per tile, whatever M is (a warp group's float16 tensor-core tile height)
MAX_HALF_ROWS = 64  # most rows per product on this route (decode rows): one tile
HALF_TILE = (64, 128, 4, 3)  # BLOCK_N, STEP, num_warps, num_stages: no scratch for sm_90 (gufo kernels own)
HALF_ROW_FORMATS = (Q.F16,)  # the weights this route multiplies (TritonLinear makes every weight one)


@triton.jit(do_not_specialize=["M"])
def rows_f16(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # grid (row tiles, output tiles, splits): the row tiles of one output tile run side by side
    wait_for_inputs(PDL)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    row = tl.where(n < N, n, 0).to(tl.int64)  # rows past N read row 0: in bounds, never stored
    first = split * steps_per_split
    last = tl.minimum(first + steps_per_split, n_steps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for step in range(first, last):
        k = step * STEP + tl.arange(0, STEP)
        in_k = k < K
        x_mask = (m < M)[:, None] & in_k[None, :]
        x = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + row[:, None] * K + k[None, :], mask=in_k[None, :], other=0.0)
        acc = tl.dot(x.to(tl.float16), tl.trans(w), acc)
    store_partials(out_ptr, acc, m, n, M, N, split)


def launch(
    x: torch.Tensor,
    planes: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    grid: tuple[int, int, int],
    n_steps: int,
    per_split: int,
    options: dict[str, bool],
) -> None:
    """out[split, m, n] of rows x [M, K] (float32/float16/bfloat16, unit column stride) and an F16 weight's
    planes; grid (row tiles of BLOCK_M, output tiles of HALF_TILE's BLOCK_N, splits); `options` the
    dependent-launch ones (DependentLaunch.options)."""
    m, k = x.shape
    block_n, step, warps, stages = HALF_TILE
    rows_f16[grid](
        x, planes[0], out, m, out.shape[-1], k, x.stride(0), n_steps, per_split,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, STEP=step, num_warps=warps, num_stages=stages, **options,
    )  # fmt: skip

"""Prefill products on fixed tensor-core tiles: x [M, K] @ W^T for a dense weight W [N, K] (float16 or
bfloat16 operands, float32 accumulation and result).

Every program computes one BLOCK_M x BLOCK_N tile of the output over the whole of K, in order, or over
one of SPLITS fixed ranges of K whose partial tiles a second kernel adds in order, and the launch is the
same whatever M is: a row's numbers depend on that row alone, never on how many rows share the product
(batch invariance by construction: no kernel, tile or split of K chosen by M), where cuBLAS picks its
kernel, and whether to split K, by the shape. A split fills the GPU at a few hundred rows, where a
weight's few column tiles leave most multiprocessors idle, at the cost of writing and reading the
partial tiles. Programs run in groups of GROUP_M row tiles per output column block, so that a group's
weight tiles are read from the L2 cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gufo.kernels.triton import shared_memory

# BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, splits of K: one launch for every product
TILES = (128, 256, 64, 8, 3, 1)
GROUP_M = 8  # row tiles per group of programs sharing weight tiles
OPERAND_DTYPES = (torch.float16, torch.bfloat16)
SUM_BLOCK = 1024  # elements per program of the split sums


@triton.jit(do_not_specialize=["M"])
def dense_tiles(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, stride_split, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Tile pid of split program_id(1): columns k_per_split * split.. of K (a multiple of BLOCK_K), its
    partial tile at out_ptr + split * stride_split."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % group_m
    tile_n = (pid % per_group) // group_m
    m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x_rows = tl.where(m < M, m, 0).to(tl.int64)  # rows past M read row 0: in bounds, never stored
    w_rows = tl.where(n < N, n, 0).to(tl.int64)
    first = split * k_per_split
    last = tl.minimum(K, first + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(first, last, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        in_k = (k < last)[None, :]
        x = tl.load(x_ptr + x_rows[:, None] * stride_xm + k[None, :], mask=in_k, other=0.0)
        w = tl.load(w_ptr + w_rows[:, None] * stride_wn + k[None, :], mask=in_k, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + split * stride_split + m.to(tl.int64)[:, None] * stride_om + n[None, :]
    tl.store(out, acc, mask=(m < M)[:, None] & (n < N)[None, :])


@triton.jit
def tile_split_sums(partial_ptr, out_ptr, total, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = partial[0][i] + partial[1][i] + ..., in that order, for BLOCK of the `total` elements."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < total
    acc = tl.load(partial_ptr + i, mask=inside, other=0.0)
    for split in tl.static_range(1, SPLITS):
        acc += tl.load(partial_ptr + split * total + i, mask=inside, other=0.0)
    tl.store(out_ptr + i, acc, mask=inside)


def product(
    x: torch.Tensor, w: torch.Tensor, tiles: tuple[int, int, int, int, int, int] = TILES
) -> torch.Tensor:
    """x [M, K] @ w^T (w [N, K], the same dtype, float16 or bfloat16; unit column strides): float32 [M, N]."""
    if x.dtype != w.dtype or x.dtype not in OPERAND_DTYPES:
        raise TypeError(f"tile product of {x.dtype} and {w.dtype}: expected float16 or bfloat16, alike")
    if x.stride(-1) != 1 or w.stride(-1) != 1 or x.shape[-1] != w.shape[-1]:
        raise ValueError(f"tile product of x {tuple(x.shape)} and w {tuple(w.shape)}: [M, K] @ [N, K]^T")
    m, k = x.shape
    n = w.shape[0]
    block_m, block_n, block_k, warps, stages, splits = tiles
    # whole BLOCK_K steps per split: its ranges depend on K and the split count alone
    k_per_split = triton.cdiv(triton.cdiv(k, splits), block_k) * block_k
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    partial = out if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    if m and n:
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), splits)
        shared_memory.launch(
            dense_tiles, grid, x, w, partial, m, n, k, x.stride(0), w.stride(0), n, m * n, k_per_split,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M, num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
        if splits > 1:
            tile_split_sums[(triton.cdiv(m * n, SUM_BLOCK),)](
                partial, out, m * n, SPLITS=splits, BLOCK=SUM_BLOCK
            )
    return out

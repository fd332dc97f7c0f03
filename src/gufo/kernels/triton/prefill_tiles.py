"""Prefill products on fixed tensor-core tiles: x [M, K] @ W^T for a dense weight W [N, K] (float16 or
bfloat16 operands, float32 accumulation and result).

Every program computes one BLOCK_M x BLOCK_N tile of the output over the whole of K, in order, and the
tile shape is the same whatever M is: a row's numbers depend on that row alone, never on how many rows
share the product (batch invariance by construction: no split of K, no kernel chosen by the shape),
where cuBLAS picks its kernel, and whether to split K, by the shape. Programs run in groups of GROUP_M
row tiles per output column block, so that a group's weight tiles are read from the L2 cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages: one shape for every product
TILES = (128, 256, 64, 8, 3)
GROUP_M = 8  # row tiles per group of programs sharing weight tiles
OPERAND_DTYPES = (torch.float16, torch.bfloat16)


@triton.jit(do_not_specialize=["M"])
def dense_tiles(
    x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        in_k = (k < K)[None, :]
        x = tl.load(x_ptr + x_rows[:, None] * stride_xm + k[None, :], mask=in_k, other=0.0)
        w = tl.load(w_ptr + w_rows[:, None] * stride_wn + k[None, :], mask=in_k, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    out = out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :]
    tl.store(out, acc, mask=(m < M)[:, None] & (n < N)[None, :])


def product(x: torch.Tensor, w: torch.Tensor, tiles: tuple[int, int, int, int, int] = TILES) -> torch.Tensor:
    """x [M, K] @ w^T (w [N, K], the same dtype, float16 or bfloat16; unit column strides): float32 [M, N]."""
    if x.dtype != w.dtype or x.dtype not in OPERAND_DTYPES:
        raise TypeError(f"tile product of {x.dtype} and {w.dtype}: expected float16 or bfloat16, alike")
    if x.stride(-1) != 1 or w.stride(-1) != 1 or x.shape[-1] != w.shape[-1]:
        raise ValueError(f"tile product of x {tuple(x.shape)} and w {tuple(w.shape)}: [M, K] @ [N, K]^T")
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty(m, n, dtype=torch.float32, device=x.device)
    block_m, block_n, block_k, warps, stages = tiles
    if m and n:
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
        dense_tiles[grid](
            x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=GROUP_M, num_warps=warps,
            num_stages=stages,
        )  # fmt: skip
    return out

"""The grouped expert products of a prefill: one launch per 3-D expert tensor over every token-expert
assignment (kernels.expert_groups: the rows sorted by expert, in tiles of one expert's rows each).

Each program takes one row tile (grid axis 2) and BLOCK_N output rows (axis 0), offsets the activation
and output pointers to the tile's rows and every field plane to its expert's matrix, then runs the
format's tensor-core tile code of gemv_kernels (`_<format>_tiles`: the weight tile dequantized in
registers as the prefill's dequantizer writes it, rounded to the operand dtype, tl.dot with float32
accumulation). A tile's rows past its expert's last are masked; tiles past the last (the grid is sized
from the shapes, not the counts: `expert_groups.max_tiles`) do nothing. Outputs are float32 per sorted
row; each row is written by one program, so results do not depend on the grouping's timing.

The block formats with that tile code take this route on NVIDIA (and the CPU interpreter); the rest,
and ROCm (whose tl.dot tiles spilled on gfx1151), keep one product per expert (experts.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from gufo.kernels.expert_groups import ExpertGroups
from gufo.kernels.triton import shared_memory
from gufo.kernels.triton.gemv_kernels import (
    FORMATS,
    _q4_0_tiles,
    _q4_1_tiles,
    _q4_k_tiles,
    _q5_0_tiles,
    _q5_k_tiles,
    _q6_k_tiles,
    _q8_0_tiles,
)
from gufo.kernels.triton.planes import TritonWeight

Q = GGMLQuantizationType

# (BLOCK_N, num_warps) by BLOCK_M (expert_groups.tile_rows): compiled without scratch for sm_90
# (`gufo kernels own --target sm_90`; 32 rows on 4 warps spilled for Q4_0 and Q5_0). On gfx1151 most of
# these tiles spilled, so ROCm does not take them.
TILES = {16: (64, 4), 32: (64, 8), 64: (64, 4)}  # keys: expert_groups.TILE_ROWS
STAGES = 3  # Triton's default for NVIDIA, where these tiles were chosen (fewer where they do not fit)
MAX_TILES = 65535  # grid axis 2


@triton.jit
def _tile(tiles_ptr, BLOCK_M: tl.constexpr):
    """This program's tile: its expert (int64), and its first row and row bound as the tile code
    counts them (that code takes rows program_id(2) * BLOCK_M + i below M)."""
    t = tl.program_id(2)
    expert = tl.load(tiles_ptr + 3 * t).to(tl.int64)
    first = tl.load(tiles_ptr + 3 * t + 1).to(tl.int64)
    end = tl.load(tiles_ptr + 3 * t + 2)
    base = first - t * BLOCK_M  # row t * BLOCK_M + i of the tile code is sorted row first + i
    return expert, base, end - base


@triton.jit
def grouped_q4_0(
    x_ptr, qs_ptr, d_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps, qs_size, d_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q4_0_tiles(x_ptr + base * stride_xm, qs_ptr + e * qs_size, d_ptr + e * d_size, out_ptr + base * N,
            M, N, K, stride_xm, n_steps, n_steps, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def grouped_q4_1(
    x_ptr, qs_ptr, d_ptr, min_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps, qs_size, d_size, min_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q4_1_tiles(x_ptr + base * stride_xm, qs_ptr + e * qs_size, d_ptr + e * d_size,
            min_ptr + e * min_size, out_ptr + base * N, M, N, K, stride_xm, n_steps, n_steps, BLOCK_M,
            BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def grouped_q5_0(
    x_ptr, qs_ptr, qh_ptr, d_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps, qs_size, qh_size, d_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q5_0_tiles(x_ptr + base * stride_xm, qs_ptr + e * qs_size, qh_ptr + e * qh_size,
            d_ptr + e * d_size, out_ptr + base * N, M, N, K, stride_xm, n_steps, n_steps, BLOCK_M,
            BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def grouped_q8_0(
    x_ptr, qs_ptr, d_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps, qs_size, d_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q8_0_tiles(x_ptr + base * stride_xm, qs_ptr + e * qs_size, d_ptr + e * d_size, out_ptr + base * N,
            M, N, K, stride_xm, n_steps, n_steps, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def grouped_q4_k(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps,
    d_size, dmin_size, scales_size, qs_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q4_k_tiles(x_ptr + base * stride_xm, d_ptr + e * d_size, dmin_ptr + e * dmin_size,
            scales_ptr + e * scales_size, qs_ptr + e * qs_size, out_ptr + base * N, M, N, K, stride_xm,
            n_steps, n_steps, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def grouped_q5_k(
    x_ptr, d_ptr, dmin_ptr, scales_ptr, qh_ptr, qs_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps,
    d_size, dmin_size, scales_size, qh_size, qs_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q5_k_tiles(x_ptr + base * stride_xm, d_ptr + e * d_size, dmin_ptr + e * dmin_size,
            scales_ptr + e * scales_size, qh_ptr + e * qh_size, qs_ptr + e * qs_size, out_ptr + base * N,
            M, N, K, stride_xm, n_steps, n_steps, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


@triton.jit
def grouped_q6_k(
    x_ptr, ql_ptr, qh_ptr, scales_ptr, d_ptr, out_ptr, tiles_ptr, N, K, stride_xm, n_steps,
    ql_size, qh_size, scales_size, d_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP: tl.constexpr,
):  # fmt: skip
    e, base, M = _tile(tiles_ptr, BLOCK_M)
    if e >= 0:  # NO_EXPERT: past the last tile
        _q6_k_tiles(x_ptr + base * stride_xm, ql_ptr + e * ql_size, qh_ptr + e * qh_size,
            scales_ptr + e * scales_size, d_ptr + e * d_size, out_ptr + base * N, M, N, K, stride_xm,
            n_steps, n_steps, BLOCK_M, BLOCK_N, STEP, False)  # fmt: skip


KERNELS = {
    Q.Q4_0: grouped_q4_0,
    Q.Q4_1: grouped_q4_1,
    Q.Q5_0: grouped_q5_0,
    Q.Q8_0: grouped_q8_0,
    Q.Q4_K: grouped_q4_k,
    Q.Q5_K: grouped_q5_k,
    Q.Q6_K: grouped_q6_k,
}


def runs_grouped(qtype: GGMLQuantizationType) -> bool:
    """Whether expert products of this format take one grouped launch (NVIDIA or the interpreter)."""
    return qtype in KERNELS and torch.version.hip is None


def grouped_product(
    x: torch.Tensor, matrices: TritonWeight, n_experts: int, groups: ExpertGroups
) -> torch.Tensor:
    """x [A, K] (float16/bfloat16, sorted by expert as `groups` orders them) through the expert
    matrices [n_experts * N, K] (each expert N rows) -> float32 [A, N]: row i by its expert's matrix."""
    if not runs_grouped(matrices.qtype):
        raise ValueError(f"no grouped expert product for {matrices.qtype.name} weights")
    if groups.block_m not in TILES:
        raise ValueError(
            f"grouped expert product: tiles of {groups.block_m} rows, expected one of {list(TILES)}"
        )
    n_tiles = groups.tiles.shape[0]
    if n_tiles > MAX_TILES:
        raise ValueError(f"grouped expert product: {n_tiles} row tiles, at most {MAX_TILES} per launch")
    rows, k = matrices.shape[0] // n_experts, matrices.shape[1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape[0], rows, dtype=torch.float32, device=x.device)
    if x.shape[0] == 0:
        return out
    step = FORMATS[matrices.qtype].step
    block_n, warps = TILES[groups.block_m]
    sizes = [rows * plane.shape[1] for plane in matrices.planes]  # elements of each expert per plane
    grid = (triton.cdiv(rows, block_n), 1, n_tiles)
    shared_memory.launch(
        KERNELS[matrices.qtype], grid, x, *matrices.planes, out, groups.tiles, rows, k, x.stride(0),
        triton.cdiv(k, step), *sizes, BLOCK_M=groups.block_m, BLOCK_N=block_n, STEP=step, num_warps=warps,
        num_stages=STAGES,
    )  # fmt: skip
    return out

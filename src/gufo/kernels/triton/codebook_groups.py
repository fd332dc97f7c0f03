"""@triton.jit decoders of the codebook formats' groups of 32 elements, shared by the float kernels
(gemv_kernels: values as float32) and the int8 ones (gemv_int8: values as int8 words): each reads its
format's planes (planes.py) and tables (planes.tables) and follows gguf's operations for the scales."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def super_block(row, g, n_groups):
    """Super-block index [BLOCK_N, G] of groups g of rows `row` (8 groups of 32 per 256), g's place in it."""
    return row[:, None] * (n_groups // 8) + (g // 8)[None, :], (g % 8)[None, :]


@triton.jit
def iq4_xs_scale(d_ptr, scales_h_ptr, scales_l_ptr, sb, ib):
    """IQ4_XS scale d * (ls - 32) of groups ib of super-blocks sb: per 256 d, scales_h (2 high bits of group
    ib's 6-bit scale at bit 2ib), scales_l[4] (4 low bits, nibble ib % 2 of byte ib // 2)."""
    high = (tl.load(scales_h_ptr + sb).to(tl.int32) >> (2 * ib)) & 3
    low = (tl.load(scales_l_ptr + sb * 4 + ib // 2).to(tl.int32) >> (4 * (ib % 2))) & 15
    return tl.load(d_ptr + sb).to(tl.float32) * ((low | (high << 4)) - 32).to(tl.float32)


@triton.jit
def _group_bytes(ptr, start, COUNT: tl.constexpr, WORDS: tl.constexpr):
    """Bytes start..start + COUNT - 1 [BLOCK_N, G, COUNT] (uint8) of a byte plane: read as bytes, or
    (WORDS: the plane viewed as int32, `start` a multiple of 4) as COUNT // 4 words split by shifts."""
    # one return of one type: compiled, the returns of both constexpr branches must agree
    if WORDS:
        words = tl.load(ptr + (start // 4)[:, :, None] + tl.arange(0, COUNT // 4)[None, None, :])
        parts = (words[:, :, :, None] >> (8 * tl.arange(0, 4))[None, None, None, :]) & 255
        values = tl.reshape(parts, (parts.shape[0], parts.shape[1], COUNT)).to(tl.uint8)
    else:
        values = tl.load(ptr + start[:, :, None] + tl.arange(0, COUNT)[None, None, :])
    return values


@triton.jit
def grid_table(grid_ptr, SIZE: tl.constexpr, SHARED: tl.constexpr):
    """What `grid_entries` reads a grid of SIZE entries from: grid_ptr itself, or (SHARED) the whole
    table as a tensor, loaded once per program before its K loop."""
    return tl.load(grid_ptr + tl.arange(0, SIZE)) if SHARED else grid_ptr


@triton.jit
def grid_entries(grid, index, SHARED: tl.constexpr):
    """grid[index] of a `grid_table`: a load (through L1: a warp's random indices touch many 128-byte
    lines, one wavefront each), or (SHARED) tl.gather from the table, which compiled goes through shared
    memory (bank conflicts only); the same values either way."""
    if SHARED:
        entries = tl.reshape(tl.gather(grid, tl.reshape(index, (index.numel,)), 0), index.shape)
    else:
        entries = tl.load(grid + index)
    return entries


@triton.jit
def iq3_s_parts(d_ptr, qs_ptr, qh_ptr, signs_ptr, scales_ptr, grid_ptr, sb, ib, WORDS: tl.constexpr = False,
                SHARED: tl.constexpr = False):  # fmt: skip
    """IQ3_S groups ib of super-blocks sb: their lattice points as int32 words [BLOCK_N, G, 8] (4 values
    each, elements 4p..4p + 3), sign bytes [BLOCK_N, G, 4] (bit j of byte l: element 8l + j negative)
    and scales [BLOCK_N, G]. WORDS: qs and signs are the planes viewed as int32 (`_group_bytes`);
    SHARED: grid_ptr is the grid's `grid_table` (512 words)."""
    # per 256: d, qs[64] (low 8 bits of the 9-bit grid index of 4 elements), qh[8] (bit p of byte ib: the
    # 9th bit of index p of group ib), signs[32] (a bit per element), scales[4] (nibble ib % 2 of byte
    # ib // 2: scale d * (1 + 2 * code))
    p = tl.arange(0, 8)[None, None, :]
    qs = _group_bytes(qs_ptr, sb * 64 + ib * 8, 8, WORDS).to(tl.int32)
    qh = tl.load(qh_ptr + sb * 8 + ib).to(tl.int32)
    words = grid_entries(grid_ptr, qs | (((qh[:, :, None] >> p) & 1) << 8), SHARED)
    signs = _group_bytes(signs_ptr, sb * 32 + ib * 4, 4, WORDS)
    code = (tl.load(scales_ptr + sb * 4 + ib // 2).to(tl.int32) >> (4 * (ib % 2))) & 15
    return words, signs, tl.load(d_ptr + sb).to(tl.float32) * (1 + 2 * code).to(tl.float32)


@triton.jit
def _xxs_signs_scale(d_ptr, sb, aux, ksigns_ptr, step, PARITY: tl.constexpr):
    """IQ2_XXS/IQ3_XXS word aux [BLOCK_N, G]: the sign bytes of its four 7-bit sign indices (bits 0, 7,
    14, 21; each signs 8 elements) and the group scale d * (0.5 + bits 28..31) * step. The bytes are
    gguf's ksigns[index], read from it or (PARITY) computed: the index with bit 7 set where the index
    has an odd number of set bits (so that every 8 elements have an even number of minus signs)."""
    index = (aux[:, :, None] >> (7 * tl.arange(0, 4))[None, None, :]) & 127
    scale = tl.load(d_ptr + sb).to(tl.float32) * (((aux >> 28) & 15).to(tl.float32) + 0.5) * step
    if PARITY:
        odd = index ^ (index >> 4)
        odd ^= odd >> 2
        odd ^= odd >> 1
        signs = (index | ((odd & 1) << 7)).to(tl.uint8)  # the table's dtype: one return type
    else:
        signs = tl.load(ksigns_ptr + index)
    return signs, scale


@triton.jit
def iq3_xxs_parts(d_ptr, qs_ptr, aux_ptr, grid_ptr, ksigns_ptr, sb, ib, WORDS: tl.constexpr = False,
                  PARITY: tl.constexpr = False, SHARED: tl.constexpr = False):  # fmt: skip
    """IQ3_XXS groups as `iq3_s_parts` returns them; WORDS: qs viewed as int32, PARITY: the sign bytes
    computed (`_xxs_signs_scale`), SHARED: grid_ptr is the grid's `grid_table` (256 words)."""
    # per 256: d, qs[64] (8-bit grid index of 4 elements), then a uint32 per group (`_xxs_signs_scale`)
    qs = _group_bytes(qs_ptr, sb * 64 + ib * 8, 8, WORDS).to(tl.int32)
    signs, scale = _xxs_signs_scale(d_ptr, sb, tl.load(aux_ptr + sb * 8 + ib), ksigns_ptr, 0.5, PARITY)
    return grid_entries(grid_ptr, qs, SHARED), signs, scale


@triton.jit
def iq2_xxs_parts(d_ptr, qs_ptr, grid_ptr, ksigns_ptr, sb, ib, PARITY: tl.constexpr = False,
                  WIDE: tl.constexpr = False, SHARED: tl.constexpr = False):  # fmt: skip
    """IQ2_XXS groups as `iq3_s_parts` returns them; PARITY: the sign bytes computed
    (`_xxs_signs_scale`); WIDE: the grid viewed as int64, one read per 8-value point instead of two;
    SHARED: grid_ptr is the grid's `grid_table` (512 words, WIDE: 256 int64)."""
    # per 256: d, then per group two uint32: four 8-bit indices of 8-element grid points (2 words each),
    # and the `_xxs_signs_scale` word
    words, aux = tl.split(tl.load(qs_ptr + (sb * 16 + ib * 2)[:, :, None] + tl.arange(0, 2)[None, None, :]))
    index = (words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 255
    if WIDE:
        point = grid_entries(grid_ptr, index, SHARED)  # little-endian: word 0 in the low half
        points = tl.join(point.to(tl.int32), (point >> 32).to(tl.int32))
    else:
        pairs = (2 * index)[:, :, :, None] + tl.arange(0, 2)[None, None, None, :]  # a point's 2 words
        points = grid_entries(grid_ptr, pairs, SHARED)
    signs, scale = _xxs_signs_scale(d_ptr, sb, aux, ksigns_ptr, 0.25, PARITY)
    return tl.reshape(points, (points.shape[0], points.shape[1], 8)), signs, scale

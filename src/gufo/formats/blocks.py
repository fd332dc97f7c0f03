"""GGUF block formats in torch: unpack raw blocks into integers + per-group scale/offset, and dequantize.

Every quantized format is unpacked into one common form (`UnpackedBlocks`): signed 8-bit integers `q`
(already centered as the format defines them), a float32 `scale` per group of 16 or 32 elements, and
an optional float32 `offset` per group. The float value of an element is

    q * scale (+ offset)

computed in float32, which reproduces `gguf.quants.dequantize` (and ggml's own `to_float`) bit for
bit: super-block scales are folded into `scale`/`offset` with the same float32 products, in the same
order, as the reference code (Q4_K: scale = d * sc, offset = -(dmin * m); `a - b` and `a + (-b)` are
the same IEEE operation). `dequantize` is exactly that expression applied to `unpack`'s result, so a
kernel that consumes `UnpackedBlocks` inherits the same numerics.

The codebook formats fit the same form without extending it: their values are small integers (the
IQ4 levels, an IQ2/IQ3 lattice point times its sign, MXFP4's doubled e2m1 values, -1/0/1 for TQ)
times one float32 scale per group, and the reference rounds each element once, as `q * scale` does.
IQ1's per-group shift of +-1/8 goes into q in eighths (q = 8 * point +- 1, scale = dl / 8, the
division exact), not into `offset`: a separate offset would round twice. The tables come from the
`gguf` package (`gufo.formats.codebooks`).

All unpacking is vectorized over rows and blocks (no Python loop over blocks) and works on any torch
device.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from gufo.errors import BadInputError
from gufo.formats import codebooks

Q = GGMLQuantizationType

# Elements per row chunk in `dequantize` on the CPU: a few large chunks (not many small ones, whose
# per-op thread barriers cost more than they save when cores are shared).
_CHUNK_ELEMENTS = 1 << 24

FLOAT_QTYPES: dict[GGMLQuantizationType, torch.dtype] = {
    Q.F32: torch.float32,
    Q.F16: torch.float16,
    Q.BF16: torch.bfloat16,
}


@dataclass
class UnpackedBlocks:
    """Integer values and per-group scales of a quantized matrix.

    q:      int8 [rows, K], the integer value of each element as the format defines it
            (Q4_0: -8..7, Q4_1: 0..15, Q5_0: -16..15, Q5_1: 0..31, Q8_0: -128..127, Q2_K: 0..3,
            Q3_K: -4..3, Q4_K: 0..15, Q5_K: 0..31, Q6_K: -32..31; IQ4_NL/IQ4_XS: their 16 levels in
            -127..113, IQ2_*: +-8/25/43, IQ3_XXS: +-4..62, IQ3_S: +-1..15, IQ1_S/IQ1_M: 8 * (-1/0/1)
            +- 1, TQ1_0/TQ2_0: -1..1 (TQ2_0 can store 2), MXFP4: -12..12).
    scale:  float32 [rows, K // group] (TQ*'s one scale per 256 is repeated for each 32).
    offset: float32 [rows, K // group], or None for symmetric formats (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, and
            all the codebook and ternary formats).
    group:  elements per scale (16 or 32): 16 for Q2_K, Q3_K, Q6_K, IQ2_XS, IQ2_S, IQ1_M.
    """

    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None
    group: int

    def to_float(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 [rows, K]: q * scale (+ offset), each group broadcast over its elements.

        Same per-element float32 operations, in the same order, as
        `q.float() * scale.repeat_interleave(group, -1) + offset.repeat_interleave(group, -1)`,
        without materializing the repeated scales. `out`: optional contiguous float32 [rows, K].
        """
        rows, k = self.q.shape
        if out is None:
            out = torch.empty(rows, k, dtype=torch.float32, device=self.q.device)
        grouped = out.view(rows, k // self.group, self.group)
        grouped.copy_(self.q.view(rows, k // self.group, self.group))
        grouped.mul_(self.scale.unsqueeze(-1))
        if self.offset is not None:
            grouped.add_(self.offset.unsqueeze(-1))
        return out


# --------------------------------------------------------------------------------------------------
# helpers


def _f16(b: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at byte `offset` (even) of each block [..., bytes_per_block] -> float32 [...]."""
    return b.view(torch.int16)[..., offset // 2].view(torch.float16).to(torch.float32)


@functools.cache
def _shifts(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Bit shifts as a device tensor, made once per device (CUDA graph capture forbids host copies)."""
    return torch.tensor(values, dtype=torch.uint8, device=device)


def _nibbles(qs: torch.Tensor, span: int) -> torch.Tensor:
    """[..., n*span] uint8 -> [..., n, 2, span]: low nibbles of each span, then high nibbles."""
    x = qs.reshape(*qs.shape[:-1], -1, 1, span)
    return (x >> _shifts((0, 4), qs.device).view(2, 1)) & 0x0F


def _crumbs(qs: torch.Tensor, span: int) -> torch.Tensor:
    """[..., n*span] uint8 -> [..., n, 4, span]: 2-bit fields at bits 0, 2, 4, 6 of each span."""
    x = qs.reshape(*qs.shape[:-1], -1, 1, span)
    return (x >> _shifts((0, 2, 4, 6), qs.device).view(4, 1)) & 0x03


def _bits(qh: torch.Tensor, span: int) -> torch.Tensor:
    """[..., n*span] uint8 -> [..., n, 8, span]: bit 0..7 of each byte of each span."""
    x = qh.reshape(*qh.shape[:-1], -1, 1, span)
    return (x >> _shifts(tuple(range(8)), qh.device).view(8, 1)) & 0x01


def _blocks(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None, group: int) -> UnpackedBlocks:
    """Per-block pieces [rows, n_blocks, ...] -> contiguous [rows, K] / [rows, K // group]."""
    rows = q.shape[0]

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(rows, -1).contiguous()

    return UnpackedBlocks(flat(q), flat(scale), None if offset is None else flat(offset), group)


def _times(d: torch.Tensor, ints: torch.Tensor) -> torch.Tensor:
    """Super-block scale (float32 [rows, n_blocks]) times small integers [rows, n_blocks, n], in float32."""
    return d.unsqueeze(-1) * ints.to(torch.float32)


def _kquant_scale_offset(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K header (d, dmin, 12 bytes of eight 6-bit scales and mins) -> scale = d*sc, -(dmin*m)."""
    d, dmin, packed = _f16(b, 0), _f16(b, 2), b[..., 4:16]
    lo, mid, hi = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], dim=-1)
    mn = torch.cat([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    return _times(d, sc), -_times(dmin, mn)


# --------------------------------------------------------------------------------------------------
# per-format unpackers: blocks uint8 [rows, n_blocks, bytes_per_block] -> UnpackedBlocks


def _q4_0(b: torch.Tensor) -> UnpackedBlocks:
    q = _nibbles(b[..., 2:18], 16).view(torch.int8) - 8
    return _blocks(q, _f16(b, 0), None, 32)


def _q4_1(b: torch.Tensor) -> UnpackedBlocks:
    q = _nibbles(b[..., 4:20], 16).view(torch.int8)
    return _blocks(q, _f16(b, 0), _f16(b, 2), 32)


def _q5_low_high(ql: torch.Tensor, qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1: 16 bytes of nibbles + 4 bytes (one little-endian uint32) of 5th bits -> [..., 32]."""
    low = _nibbles(ql, 16).flatten(-3)
    high = _bits(qh, 4).transpose(-1, -2).flatten(-3)  # bit j of the uint32 = bit j%8 of byte j//8
    return low | (high << 4)


def _q5_0(b: torch.Tensor) -> UnpackedBlocks:
    q = _q5_low_high(b[..., 6:22], b[..., 2:6]).view(torch.int8) - 16
    return _blocks(q, _f16(b, 0), None, 32)


def _q5_1(b: torch.Tensor) -> UnpackedBlocks:
    q = _q5_low_high(b[..., 8:24], b[..., 4:8]).view(torch.int8)
    return _blocks(q, _f16(b, 0), _f16(b, 2), 32)


def _q8_0(b: torch.Tensor) -> UnpackedBlocks:
    return _blocks(b[..., 2:34].view(torch.int8), _f16(b, 0), None, 32)


def _q2_k(b: torch.Tensor) -> UnpackedBlocks:
    # scales[16] qs[64] d dmin; element 128*h + 32*s + l = (qs[32*h + l] >> 2s) & 3
    scales = b[..., 0:16]
    q = _crumbs(b[..., 16:80], 32).view(torch.int8)
    return _blocks(q, _times(_f16(b, 80), scales & 0x0F), -_times(_f16(b, 82), scales >> 4), 16)


def _q3_k(b: torch.Tensor) -> UnpackedBlocks:
    # hmask[32] qs[64] scales[12] d; high bit of element 32*j + l = bit j of hmask[l];
    # q = low 2 bits - 4 where that bit is 0 (ggml stores the high bit inverted)
    hmask, qs, sc = b[..., 0:32], b[..., 32:96], b[..., 96:108]
    low = _crumbs(qs, 32).flatten(-3).view(torch.int8)
    high = _bits(hmask, 32).flatten(-3).view(torch.int8)
    q = low - ((high ^ 1) << 2)
    lsc = _nibbles(sc[..., 0:8], 8).flatten(-3)  # 16 low nibbles
    hsc = _crumbs(sc[..., 8:12], 4).flatten(-3)  # 16 two-bit highs
    scales = (lsc | (hsc << 4)).view(torch.int8) - 32
    return _blocks(q, _times(_f16(b, 108), scales), None, 16)


def _q4_k(b: torch.Tensor) -> UnpackedBlocks:
    # d dmin scales[12] qs[128]; element 64*c + 32*n + l = (qs[32*c + l] >> 4n) & 15
    q = _nibbles(b[..., 16:144], 32).view(torch.int8)
    return _blocks(q, *_kquant_scale_offset(b), 32)


def _q5_k(b: torch.Tensor) -> UnpackedBlocks:
    # d dmin scales[12] qh[32] qs[128]; 5th bit of element 32*j + l = bit j of qh[l]
    low = _nibbles(b[..., 48:176], 32).flatten(-3)
    high = _bits(b[..., 16:48], 32).flatten(-3)
    q = (low | (high << 4)).view(torch.int8)
    return _blocks(q, *_kquant_scale_offset(b), 32)


def _q6_k(b: torch.Tensor) -> UnpackedBlocks:
    # ql[128] qh[64] scales[16] (int8) d; element 128*h + 64*n + l: low = (ql[64h + l] >> 4n) & 15,
    # element 128*h + 32*s + l: high = (qh[32h + l] >> 2s) & 3
    low = _nibbles(b[..., 0:128], 64).flatten(-3)
    high = _crumbs(b[..., 128:192], 32).flatten(-3)
    q = (low | (high << 4)).view(torch.int8) - 32
    return _blocks(q, _times(_f16(b, 208), b[..., 192:208].view(torch.int8)), None, 16)


# --------------------------------------------------------------------------------------------------
# codebook and ternary formats. Their values are small integers times a float32 group scale, so they fit
# the same form exactly: a lattice point times its sign is an int8 (|value| <= 62), and every reference
# product has one rounding, as `q * scale` has. IQ1's +-1/8 shift is folded into q: dl * (g + delta) =
# (8g +- 1) * (dl / 8), dl / 8 exact (a power-of-two step of a normal float32), one rounding each side.


def _words(b: torch.Tensor, width: int) -> torch.Tensor:
    """Little-endian unsigned `width`-byte integers [..., n] (int64) from bytes [..., n * width]."""
    parts = b.reshape(*b.shape[:-1], -1, width).to(torch.int64)
    return (parts << _shifts(tuple(range(0, 8 * width, 8)), b.device)).sum(-1)


def _signs(bits: torch.Tensor) -> torch.Tensor:
    """Sign bits (0/1, uint8) -> +1 / -1 as int8."""
    return 1 - 2 * bits.view(torch.int8)


def _lookup(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of a [entries, width] table for each index [...] -> [..., width] (any integer index)."""
    return table[index.to(torch.int64)]


def _half_steps(d: torch.Tensor, codes: torch.Tensor, step: float) -> torch.Tensor:
    """IQ2/IQ3_XXS block scales d * (0.5 + code) * step, in float32 in gguf's order."""
    return d.unsqueeze(-1) * (codes.to(torch.float32) + 0.5) * step


def _iq4_nl(b: torch.Tensor) -> UnpackedBlocks:
    q = _lookup(codebooks.levels(Q.IQ4_NL, b.device), _nibbles(b[..., 2:18], 16))
    return _blocks(q, _f16(b, 0), None, 32)


def _iq4_xs(b: torch.Tensor) -> UnpackedBlocks:
    # d scales_h(uint16: 2 bits per 32) scales_l[4] (4 bits per 32) qs[128]; sub-scale = 6 bits - 32
    low = _nibbles(b[..., 4:8], 1).flatten(-3)
    high = _crumbs(b[..., 2:4], 1).flatten(-3)
    scales = (low | (high << 4)).view(torch.int8) - 32
    q = _lookup(codebooks.levels(Q.IQ4_XS, b.device), _nibbles(b[..., 8:136], 16))
    return _blocks(q, _times(_f16(b, 0), scales), None, 32)


def _iq2_xxs(b: torch.Tensor) -> UnpackedBlocks:
    # d, then per 32 elements two uint32: four grid indices (bytes), and four 7-bit sign indices
    # (bits 0, 7, 14, 21) with a 4-bit scale (bits 28-31)
    words = b[..., 2:66].reshape(*b.shape[:-1], 8, 8)
    points = _lookup(codebooks.grid(Q.IQ2_XXS, b.device), words[..., 0:4])  # [..., 8, 4, 8]
    aux = _words(words[..., 4:8], 4)  # [..., 8, 1]
    sign_index = (aux >> _shifts((0, 7, 14, 21), b.device)) & 0x7F
    q = points * _lookup(codebooks.signs(b.device), sign_index)
    return _blocks(q, _half_steps(_f16(b, 0), (aux >> 28).squeeze(-1), 0.25), None, 32)


def _iq2_xs(b: torch.Tensor) -> UnpackedBlocks:
    # d qs[32] (uint16: 9-bit grid index, 7-bit sign index per 8 elements) scales[8] (4 bits per 16)
    qs = _words(b[..., 2:66], 2)
    points = _lookup(codebooks.grid(Q.IQ2_XS, b.device), qs & 0x1FF)
    q = points * _lookup(codebooks.signs(b.device), qs >> 9)
    return _blocks(q, _half_steps(_f16(b, 0), _nibbles(b[..., 66:74], 1).flatten(-3), 0.25), None, 16)


def _iq2_s(b: torch.Tensor) -> UnpackedBlocks:
    # d qs[32] (low 8 bits of 10-bit grid indices) signs[32] (one bit per element) qh[8] (2 high bits
    # per index) scales[8] (4 bits per 16)
    index = b[..., 2:34].to(torch.int64) | (_crumbs(b[..., 66:74], 1).flatten(-3).to(torch.int64) << 8)
    points = _lookup(codebooks.grid(Q.IQ2_S, b.device), index)
    q = points * _signs(_bits(b[..., 34:66], 1)).flatten(-2)
    return _blocks(q, _half_steps(_f16(b, 0), _nibbles(b[..., 74:82], 1).flatten(-3), 0.25), None, 16)


def _iq3_xxs(b: torch.Tensor) -> UnpackedBlocks:
    # d qs[64] (grid indices of 4 elements) then per 32 elements a uint32: four 7-bit sign indices and
    # a 4-bit scale, as in IQ2_XXS
    points = _lookup(codebooks.grid(Q.IQ3_XXS, b.device), b[..., 2:66])  # [..., 64, 4]
    aux = _words(b[..., 66:98], 4)  # [..., 8]
    sign_index = (aux.unsqueeze(-1) >> _shifts((0, 7, 14, 21), b.device)) & 0x7F
    q = points.reshape(*aux.shape, 4, 8) * _lookup(codebooks.signs(b.device), sign_index)
    return _blocks(q, _half_steps(_f16(b, 0), aux >> 28, 0.5), None, 32)


def _iq3_s(b: torch.Tensor) -> UnpackedBlocks:
    # d qs[64] (low 8 bits of 9-bit grid indices) qh[8] (their high bits) signs[32] scales[4] (4 bits
    # per 32: the scale is d * (1 + 2 * code))
    index = b[..., 2:66].to(torch.int64) | (_bits(b[..., 66:74], 1).flatten(-3).to(torch.int64) << 8)
    points = _lookup(codebooks.grid(Q.IQ3_S, b.device), index)  # [..., 64, 4]
    q = points.flatten(-2) * _signs(_bits(b[..., 74:106], 1)).flatten(-3)
    codes = _nibbles(b[..., 106:110], 1).flatten(-3)
    return _blocks(q, _times(_f16(b, 0), 1 + 2 * codes), None, 32)


def _iq1_q(points: torch.Tensor, negative_delta: torch.Tensor) -> torch.Tensor:
    """8 * lattice point (-1/0/1) +- 1: IQ1's values in steps of dl / 8, the shift of each point's
    group (negative_delta broadcast over it) folded in."""
    return points * 8 + (1 - 2 * negative_delta.view(torch.int8))


def _iq1_s(b: torch.Tensor) -> UnpackedBlocks:
    # d qs[32] (low 8 bits of 11-bit grid indices) qh[16] (a uint16 per 32 elements: 4 x 3 high index
    # bits, a 3-bit scale at bit 12, the shift's sign at bit 15)
    qh = _words(b[..., 34:50], 2)  # [..., 8]
    high = (qh.unsqueeze(-1) >> _shifts((0, 3, 6, 9), b.device)) & 7
    index = b[..., 2:34].to(torch.int64) | (high.flatten(-2) << 8)
    points = _lookup(codebooks.grid(Q.IQ1_S, b.device), index)  # [..., 32, 8]
    negative = (qh >> 15).to(torch.uint8).repeat_interleave(4, -1).unsqueeze(-1)
    dl = _times(_f16(b, 0), 2 * ((qh >> 12) & 7) + 1)
    return _blocks(_iq1_q(points, negative), dl * 0.125, None, 32)


def _iq1_m(b: torch.Tensor) -> UnpackedBlocks:
    # qs[32] (low 8 bits of 11-bit grid indices) qh[16] (a nibble per 8 elements: 3 high index bits and
    # the shift's sign) scales[8] (4 uint16: 3-bit scales per 16 at bits 0/3/6/9; the fp16 d is the
    # four top nibbles)
    sc = b[..., 48:56]
    d_low, d_high = (sc[..., 1] >> 4) | (sc[..., 3] & 0xF0), (sc[..., 5] >> 4) | (sc[..., 7] & 0xF0)
    d = torch.stack([d_low, d_high], -1).view(torch.float16).squeeze(-1).to(torch.float32)
    words = _words(sc, 2)  # [..., 4]
    codes = ((words.unsqueeze(-1) >> _shifts((0, 3, 6, 9), b.device)) & 7).flatten(-2)
    nibble = _nibbles(b[..., 32:48], 1).flatten(-3)  # [..., 32]
    index = b[..., 0:32].to(torch.int64) | ((nibble & 7).to(torch.int64) << 8)
    points = _lookup(codebooks.grid(Q.IQ1_M, b.device), index)  # [..., 32, 8]
    q = _iq1_q(points, (nibble >> 3).unsqueeze(-1))
    return _blocks(q, _times(d, 2 * codes + 1) * 0.125, None, 16)


def _per_32(d: torch.Tensor, elements: int) -> torch.Tensor:
    """One block scale [..., n_blocks] repeated for each 32 of its elements (the kernels take 16/32)."""
    return d.unsqueeze(-1).expand(*d.shape, elements // 32)


def _tq1_0(b: torch.Tensor) -> UnpackedBlocks:
    # qs[48] qh[4] d: each byte holds 5 (qh: 4) ternary digits as a fixed-point fraction of 3**5; digit
    # k is ((byte * 3**k mod 256) * 3) >> 8, minus 1; qs[0:32] give elements 0..159 (digit-major),
    # qs[32:48] 160..239, qh 240..255
    powers = _shifts((1, 3, 9, 27, 81), b.device).view(5, 1)

    def digits(x: torch.Tensor, n: int) -> torch.Tensor:
        scaled = x.reshape(*x.shape[:-1], 1, x.shape[-1]) * powers[:n]  # uint8: wraps mod 256
        return ((scaled.to(torch.int16) * 3) >> 8).flatten(-2)

    q = torch.cat([digits(b[..., 0:32], 5), digits(b[..., 32:48], 5), digits(b[..., 48:52], 4)], -1)
    return _blocks(q.to(torch.int8) - 1, _per_32(_f16(b, 52), 256), None, 32)


def _tq2_0(b: torch.Tensor) -> UnpackedBlocks:
    # qs[64] d: 2-bit codes (element 128*h + 32*s + l at bits 2s of qs[32h + l]) minus 1
    q = _crumbs(b[..., 0:64], 32).view(torch.int8) - 1
    return _blocks(q, _per_32(_f16(b, 64), 256), None, 32)


def _mxfp4(b: torch.Tensor) -> UnpackedBlocks:
    # e (e8m0) qs[16]: 4-bit e2m1 codes; values are the doubled e2m1 levels times half of 2**(e - 127)
    # (ggml_e8m0_to_fp32_half: for e < 2 that half is a subnormal float32)
    e = b[..., 0].to(torch.int32)
    bits = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    q = _lookup(codebooks.levels(Q.MXFP4, b.device), _nibbles(b[..., 1:17], 16))
    return _blocks(q, bits.view(torch.float32), None, 32)


_UNPACKERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], UnpackedBlocks]] = {
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q8_0: _q8_0,
    Q.Q2_K: _q2_k,
    Q.Q3_K: _q3_k,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
    Q.IQ4_NL: _iq4_nl,
    Q.IQ4_XS: _iq4_xs,
    Q.IQ2_XXS: _iq2_xxs,
    Q.IQ2_XS: _iq2_xs,
    Q.IQ2_S: _iq2_s,
    Q.IQ3_XXS: _iq3_xxs,
    Q.IQ3_S: _iq3_s,
    Q.IQ1_S: _iq1_s,
    Q.IQ1_M: _iq1_m,
    Q.TQ1_0: _tq1_0,
    Q.TQ2_0: _tq2_0,
    Q.MXFP4: _mxfp4,
}

QUANTIZED_QTYPES: frozenset[GGMLQuantizationType] = frozenset(_UNPACKERS)
SUPPORTED_QTYPES: frozenset[GGMLQuantizationType] = frozenset(FLOAT_QTYPES) | QUANTIZED_QTYPES


# --------------------------------------------------------------------------------------------------
# public API


def _qtype(qtype: GGMLQuantizationType | int) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType(qtype)
    except ValueError:
        raise BadInputError(f"unknown GGML tensor type id {int(qtype)}") from None


def unsupported_reason(qtype: GGMLQuantizationType | int) -> str | None:
    """None when gufo can use tensors of this type, else a one-line reason naming the type."""
    try:
        qt = GGMLQuantizationType(qtype)
    except ValueError:
        return f"unknown GGML tensor type id {int(qtype)}"
    if qt in SUPPORTED_QTYPES:
        return None
    name = qt.name
    if qt in (Q.Q8_1, Q.Q8_K):
        kind = "an intermediate type ggml uses for activations, not for stored weights"
    elif qt in (Q.I8, Q.I16, Q.I32, Q.I64, Q.F64):
        kind = "an integer or float64 tensor type"
    else:
        kind = "a block format"
    supported = ", ".join(t.name for t in sorted(SUPPORTED_QTYPES, key=lambda t: t.value))
    return f"tensor type {name} is {kind} that gufo does not support (supported: {supported})"


def block_shape(qtype: GGMLQuantizationType | int) -> tuple[int, int]:
    """(elements per block, bytes per block); (1, element size) for F32/F16/BF16."""
    qt = _qtype(qtype)
    elems, nbytes = GGML_QUANT_SIZES[qt]
    return int(elems), int(nbytes)


def _check_supported(qt: GGMLQuantizationType) -> None:
    reason = unsupported_reason(qt)
    if reason is not None:
        raise BadInputError(reason)


def _as_uint8(raw: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Raw bytes as a uint8 tensor [..., row_bytes] (F32/F16 data may come in its own dtype)."""
    if isinstance(raw, np.ndarray):
        with warnings.catch_warnings():  # read-only memmaps: we never write into `raw`
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.as_tensor(raw)
    if raw.dim() == 0:
        raise BadInputError(f"expected raw tensor bytes, got a scalar of type {raw.dtype}")
    if raw.dtype != torch.uint8:
        raw = raw.contiguous().view(torch.uint8)
    if raw.shape[-1] == 0:
        raise BadInputError("expected raw tensor bytes, got rows of 0 bytes")
    return raw


def _aligned(raw: torch.Tensor) -> torch.Tensor:
    """Contiguous, starting at an even byte: fp16 fields and F16/BF16/F32 data are read through views."""
    if not raw.is_contiguous() or raw.storage_offset() % 4:
        raw = raw.clone(memory_format=torch.contiguous_format)
    return raw


def unpack(qtype: GGMLQuantizationType | int, raw: torch.Tensor | np.ndarray) -> UnpackedBlocks:
    """Unpack GGUF blocks uint8 [rows, row_bytes] (any leading dims are flattened into rows)."""
    qt = _qtype(qtype)
    _check_supported(qt)
    if qt in FLOAT_QTYPES:
        raise ValueError(f"unpack: {qt.name} is not a block-quantized type; use dequantize()")
    raw = _as_uint8(raw)
    block_elems, block_bytes = GGML_QUANT_SIZES[qt]
    row_bytes = raw.shape[-1]
    if row_bytes % block_bytes != 0:
        raise BadInputError(
            f"{qt.name} row of {row_bytes} bytes is not a whole number of {block_bytes}-byte blocks"
        )
    blocks = _aligned(raw).reshape(raw.numel() // row_bytes, row_bytes // block_bytes, block_bytes)
    return _UNPACKERS[qt](blocks)


def dequantize(
    qtype: GGMLQuantizationType | int, raw: torch.Tensor | np.ndarray, n_cols: int
) -> torch.Tensor:
    """float32 [..., n_cols] from the raw bytes [..., row_bytes] of each row, for every supported type."""
    qt = _qtype(qtype)
    _check_supported(qt)
    raw = _as_uint8(raw)
    block_elems, block_bytes = GGML_QUANT_SIZES[qt]
    row_bytes = raw.shape[-1]
    if n_cols <= 0 or n_cols % block_elems != 0 or n_cols // block_elems * block_bytes != row_bytes:
        raise BadInputError(
            f"{qt.name}: {n_cols} elements per row do not fit rows of {row_bytes} bytes "
            f"({block_elems} elements per {block_bytes}-byte block)"
        )
    lead = raw.shape[:-1]
    if qt in FLOAT_QTYPES:
        values = _aligned(raw).view(FLOAT_QTYPES[qt])
        values = values.clone() if qt == Q.F32 else values.to(torch.float32)  # never alias `raw`
        return values.reshape(*lead, n_cols)
    # Row chunks bound the unpacked intermediates (fewer fresh pages to fault in on big matrices);
    # each chunk goes through exactly unpack() -> UnpackedBlocks.to_float().
    raw = _aligned(raw)
    rows = raw.numel() // row_bytes
    raw = raw.reshape(rows, row_bytes)
    out = torch.empty(rows, n_cols, dtype=torch.float32, device=raw.device)
    step = max(1, _CHUNK_ELEMENTS // n_cols) if raw.device.type == "cpu" else max(rows, 1)
    for start in range(0, rows, step):
        unpack(qt, raw[start : start + step]).to_float(out=out[start : start + step])
    return out.reshape(*lead, n_cols)

"""Random GGUF blocks with valid scales, written directly (no float intermediate), for `gufo synth`.

Every quant field is filled with uniform random bits, so each stored code is uniform over its range;
the per-block scale `d` is then set so that the weights have a chosen standard deviation (0.02, the
usual initialisation, keeps a random model's activations finite through many layers). Formats with
a per-group minimum store it as the midpoint of the code range times the scale, so weights are
centered on zero. Sub-block scales are drawn from a small range chosen so that `d` stays a normal
(not subnormal) float16 value. With codes uniform over 2**b values and centred at the midpoint, the
mean square code is (4**b - 1) / 12, or (4**b + 2) / 12 when the format centres them at 2**(b-1)
instead (Q4_0, Q5_0, Q8_0, Q3_K, Q6_K).

The codebook formats (IQ*) keep random bits too: grid indices, sign bits and sub-block scale codes are
uniform, and `d` follows from the mean square of the lattice (or level) table, from the `gguf`
package, times that of the sub-block scale factor. Formats whose stored codes are not all valid are
written from valid codes instead: TQ1_0/TQ2_0 hold uniform ternary digits, packed as ggml packs them,
and MXFP4's e8m0 scale is one of the two powers of two around the wanted scale, mixed to give the
wanted deviation.
"""

from __future__ import annotations

import functools

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from gufo.formats import codebooks

Q = GGMLQuantizationType

# Blocks scale d by a factor uniform in [1 - SPREAD, 1 + SPREAD], as real blocks differ in range.
SPREAD = 0.25
_SPREAD_SQUARE = 1.0 + (2 * SPREAD) ** 2 / 12  # E[factor**2]
# Codes offset by -2**(b-1) average -1/2; a random sign of d per block cancels that bias (llama.cpp's
# own quantizer also gives these formats negative scales: d = max / -2**(b-1)).
# The IQ4 levels are not symmetric (they average -5.9 of a range of +-127): a random sign again.
_SIGNED_SCALE = frozenset({Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q3_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS})


def _codes_square(bits: int, offset_at_midpoint: bool) -> float:
    levels = 4**bits
    return (levels - 1) / 12 if offset_at_midpoint else (levels + 2) / 12


def _mean_square(lo: int, hi: int) -> float:
    values = np.arange(lo, hi + 1, dtype=np.float64)
    return float(np.mean(values**2))


def random_bytes(n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` uniform random bytes (the raw generator output: several times faster than integers())."""
    return rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n]


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 field at byte `at` of every block, as a writable [n_blocks, 1] view."""
    return blocks[:, at : at + 2].view(np.float16)


def _set_scale(blocks: np.ndarray, at: int, d: np.ndarray) -> np.ndarray:
    """Store d (float32 per block) as float16 at byte `at`; return the stored (rounded) values."""
    field = _f16(blocks, at)
    field[:, 0] = d
    return field[:, 0].astype(np.float32)


def _sub_scales(rng: np.random.Generator, n_blocks: int, count: int, lo: int, hi: int) -> np.ndarray:
    return rng.integers(lo, hi + 1, size=(n_blocks, count), dtype=np.uint8)


# Sub-block scale ranges; the 12-byte K-quant scales are 6-bit, Q2_K's 4-bit, Q6_K's int8.
_KQUANT_SCALES = (16, 31)
_Q2K_SCALES = (8, 15)
_Q6K_SCALES = (4, 15)
# Q3_K: the 16 six-bit scales stay random bits, i.e. uniform over -32..31.
_Q3K_SCALE_SQUARE = _codes_square(6, offset_at_midpoint=False)


# IQ4_XS sub-block scales (6-bit, stored + 32): small, so that d stays a normal float16.
_IQ4XS_SCALES = (1, 4)
# Sub-block scale factors of the codebook formats, as ggml applies them to the 4-bit (IQ1: 3-bit) codes.
_HALF_STEPS = np.arange(16) + 0.5
_SCALE_FACTORS = {
    Q.IQ2_XXS: _HALF_STEPS * 0.25,
    Q.IQ2_XS: _HALF_STEPS * 0.25,
    Q.IQ2_S: _HALF_STEPS * 0.25,
    Q.IQ3_XXS: _HALF_STEPS * 0.5,
    Q.IQ3_S: 1 + 2 * np.arange(16),
    Q.IQ1_S: 1 + 2 * np.arange(8),
    Q.IQ1_M: 1 + 2 * np.arange(8),
}
_IQ1_SHIFT = 0.125  # IQ1's +-1/8 shift of each lattice point
_TERNARY_SQUARE = 2 / 3  # -1, 0, 1 uniform


@functools.cache
def _codebook_square(qtype: GGMLQuantizationType) -> float:
    """Mean square of an IQ2/IQ3/IQ1 value over uniform grid indices, signs and scale codes, per d**2."""
    points = codebooks.grid(qtype).double()
    code_square = float((points**2).mean())
    if qtype in (Q.IQ1_S, Q.IQ1_M):  # the shift's sign is an independent uniform bit
        code_square += _IQ1_SHIFT**2
    return code_square * float(np.mean(_SCALE_FACTORS[qtype] ** 2))


def _level_square(qtype: GGMLQuantizationType) -> float:
    return float((codebooks.levels(qtype).double() ** 2).mean())


def _pack_crumbs(values: np.ndarray) -> np.ndarray:
    """2-bit values [..., n, 4] -> bytes [..., n]: value j at bits 2j."""
    return (values[..., 0] | (values[..., 1] << 2) | (values[..., 2] << 4) | (values[..., 3] << 6)).astype(
        np.uint8
    )


def _ternary_bytes(digit_values: np.ndarray) -> np.ndarray:
    """TQ1_0 bytes holding base-3 numbers v < 243: ggml stores v as the fraction v / 243 in 8 bits,
    rounded up (ceil(v * 256 / 243)), so that digit k is ((byte * 3**k mod 256) * 3) >> 8."""
    return ((digit_values.astype(np.uint16) * 256 + 242) // 243).astype(np.uint8)


def _set_iq1_m_scale(blocks: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M's float16 d goes into the top nibbles of its four uint16 scale words (bytes 48..55)."""
    bits = d.astype(np.float16).view(np.uint16)
    for i in range(4):
        top = 48 + 2 * i + 1
        blocks[:, top] = (blocks[:, top] & 0x0F) | (((bits >> (4 * i)) & 0x0F) << 4).astype(np.uint8)


def _mxfp4_exponents(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    """e8m0 bytes: scale 2**(e - 128) (ggml's halved e8m0) is one of the two powers of two around the
    wanted scale, the upper one with the probability that gives the wanted mean square."""
    wanted = std / np.sqrt(_level_square(Q.MXFP4))
    low = int(np.floor(np.log2(wanted)))
    upper = (wanted**2 / 4.0**low - 1) / 3  # (1 - p) * 4**low + p * 4**(low + 1) = wanted**2
    return (low + 128 + (rng.random(n_blocks) < upper)).astype(np.uint8)


def _pack_kquant_scales(sc: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K 12-byte scales for 8 six-bit scales `sc` with each min equal to its scale."""
    low, high = sc[:, :4], sc[:, 4:]
    first = low | ((high >> 4) << 6)  # bytes 0-3 (scales) and 4-7 (mins) carry the same values
    last = (high & 0x0F) | ((high & 0x0F) << 4)
    return np.concatenate([first, first, last], axis=1)


def random_blocks(qtype: GGMLQuantizationType, n_blocks: int, rng: np.random.Generator, std: float = 0.02):
    """uint8 [n_blocks, bytes per block]: random blocks of `qtype` whose values have deviation `std`.

    F16 and F32 "blocks" are single values drawn from N(0, std).
    """
    qtype = Q(qtype)
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in (Q.F16, Q.F32):
        dtype = np.float16 if qtype == Q.F16 else np.float32
        values = rng.standard_normal(n_blocks, dtype=np.float32) * np.float32(std)
        return values.astype(dtype).view(np.uint8).reshape(n_blocks, block_bytes)
    blocks = random_bytes(n_blocks * block_bytes, rng).reshape(n_blocks, block_bytes)
    spread = rng.uniform(1 - SPREAD, 1 + SPREAD, size=n_blocks).astype(np.float32)
    if qtype in _SIGNED_SCALE:
        spread *= rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=n_blocks)

    def scale(mean_square: float) -> np.ndarray:
        return spread * np.float32(std / np.sqrt(mean_square * _SPREAD_SQUARE))

    if qtype in (Q.Q4_0, Q.Q5_0, Q.Q8_0):
        bits = {Q.Q4_0: 4, Q.Q5_0: 5, Q.Q8_0: 8}[qtype]
        _set_scale(blocks, 0, scale(_codes_square(bits, offset_at_midpoint=False)))
    elif qtype in (Q.Q4_1, Q.Q5_1):
        bits = 4 if qtype == Q.Q4_1 else 5
        d = _set_scale(blocks, 0, scale(_codes_square(bits, offset_at_midpoint=True)))
        _set_scale(blocks, 2, -d * (2**bits - 1) / 2)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        bits = 4 if qtype == Q.Q4_K else 5
        sc = _sub_scales(rng, n_blocks, 8, *_KQUANT_SCALES)
        d = _set_scale(blocks, 0, scale(_codes_square(bits, True) * _mean_square(*_KQUANT_SCALES)))
        _set_scale(blocks, 2, d * (2**bits - 1) / 2)  # dmin * min = d * scale * midpoint
        blocks[:, 4:16] = _pack_kquant_scales(sc)
    elif qtype == Q.Q2_K:
        sc = _sub_scales(rng, n_blocks, 16, *_Q2K_SCALES)
        blocks[:, 0:16] = sc | (sc << 4)  # low nibble scale, high nibble min: equal
        d = _set_scale(blocks, 80, scale(_codes_square(2, True) * _mean_square(*_Q2K_SCALES)))
        _set_scale(blocks, 82, d * 1.5)
    elif qtype == Q.Q3_K:
        _set_scale(blocks, 108, scale(_codes_square(3, False) * _Q3K_SCALE_SQUARE))
    elif qtype == Q.Q6_K:
        blocks[:, 192:208] = _sub_scales(rng, n_blocks, 16, *_Q6K_SCALES)
        _set_scale(blocks, 208, scale(_codes_square(6, False) * _mean_square(*_Q6K_SCALES)))
    elif qtype == Q.IQ4_NL:
        _set_scale(blocks, 0, scale(_level_square(qtype)))
    elif qtype == Q.IQ4_XS:
        sc = _sub_scales(rng, n_blocks, 8, *_IQ4XS_SCALES) + 32
        blocks[:, 2:4] = _pack_crumbs((sc >> 4).reshape(n_blocks, 2, 4))  # uint16: 2 high bits each
        blocks[:, 4:8] = (sc[:, 0::2] & 0x0F) | ((sc[:, 1::2] & 0x0F) << 4)
        _set_scale(blocks, 0, scale(_level_square(qtype) * _mean_square(*_IQ4XS_SCALES)))
    elif qtype in (Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S):
        _set_scale(blocks, 0, scale(_codebook_square(qtype)))
    elif qtype == Q.IQ1_M:
        _set_iq1_m_scale(blocks, scale(_codebook_square(qtype)))
    elif qtype == Q.TQ1_0:
        # qs[48] hold 5 digits each (v < 243), qh[4] 4 digits in the top places (v = 3 * w, w < 81)
        blocks[:, 0:48] = _ternary_bytes(rng.integers(0, 243, (n_blocks, 48)))
        blocks[:, 48:52] = _ternary_bytes(3 * rng.integers(0, 81, (n_blocks, 4)))
        _set_scale(blocks, 52, scale(_TERNARY_SQUARE))
    elif qtype == Q.TQ2_0:
        blocks[:, 0:64] = _pack_crumbs(rng.integers(0, 3, (n_blocks, 64, 4), dtype=np.uint8))
        _set_scale(blocks, 64, scale(_TERNARY_SQUARE))
    elif qtype == Q.MXFP4:
        blocks[:, 0] = _mxfp4_exponents(rng, n_blocks, std)
    else:
        raise ValueError(f"random_blocks: {qtype.name} is not supported")
    return blocks

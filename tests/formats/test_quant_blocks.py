"""Block formats against the `gguf` package's numpy dequantizers (the oracle), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants as gguf_quants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gufo.formats.blocks as blocks_mod
from gufo.errors import BadInputError
from gufo.formats import SUPPORTED_QTYPES, UnpackedBlocks, block_shape, dequantize, unpack, unsupported_reason
from gufo.formats.random_blocks import random_blocks as synth_blocks

# Byte offsets of the fp16 fields (d, and m/dmin) inside one block, from ggml's block structs
# (ggml-common.h). Random bytes there may be inf/NaN; the tests overwrite them with finite halves.
FP16_FIELDS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q5_1: (0, 2),
    Q.Q8_0: (0,),
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
    Q.IQ2_XXS: (0,),
    Q.IQ2_XS: (0,),
    Q.IQ2_S: (0,),
    Q.IQ3_XXS: (0,),
    Q.IQ3_S: (0,),
    Q.IQ1_S: (0,),
    Q.IQ1_M: (),  # its fp16 d is the top nibbles of the four uint16 scales at bytes 48..55: set_halves
    Q.TQ1_0: (52,),
    Q.TQ2_0: (64,),
    Q.MXFP4: (),  # an e8m0 exponent byte: every value is a power of two (255 overflows to inf, as in ggml)
}
IQ1_M_SCALES = 48
# (elements, bytes) per block and the integer range of q, as the formats define them.
SPEC = {
    Q.Q4_0: ((32, 18), -8, 7, 32, False),
    Q.Q4_1: ((32, 20), 0, 15, 32, True),
    Q.Q5_0: ((32, 22), -16, 15, 32, False),
    Q.Q5_1: ((32, 24), 0, 31, 32, True),
    Q.Q8_0: ((32, 34), -128, 127, 32, False),
    Q.Q2_K: ((256, 84), 0, 3, 16, True),
    Q.Q3_K: ((256, 110), -4, 3, 16, False),
    Q.Q4_K: ((256, 144), 0, 15, 32, True),
    Q.Q5_K: ((256, 176), 0, 31, 32, True),
    Q.Q6_K: ((256, 210), -32, 31, 16, False),
    Q.IQ4_NL: ((32, 18), -127, 113, 32, False),
    Q.IQ4_XS: ((256, 136), -127, 113, 32, False),
    Q.IQ2_XXS: ((256, 66), -43, 43, 32, False),
    Q.IQ2_XS: ((256, 74), -43, 43, 16, False),
    Q.IQ2_S: ((256, 82), -43, 43, 16, False),
    Q.IQ3_XXS: ((256, 98), -62, 62, 32, False),
    Q.IQ3_S: ((256, 110), -15, 15, 32, False),
    Q.IQ1_S: ((256, 50), -9, 9, 32, False),
    Q.IQ1_M: ((256, 56), -9, 9, 16, False),
    Q.TQ1_0: ((256, 54), -1, 1, 32, False),
    Q.TQ2_0: ((256, 66), -1, 2, 32, False),
    Q.MXFP4: ((32, 17), -12, 12, 32, False),
}
QUANTIZED = sorted(SPEC, key=lambda t: t.value)
FLOATS = {Q.F32: np.float32, Q.F16: np.float16, Q.BF16: np.uint16}


def reference(qtype: Q, raw: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gguf_quants.dequantize(raw, qtype), dtype=np.float32)


def assert_bits_equal(ours: torch.Tensor, ref: np.ndarray) -> None:
    """Same float32 bit patterns (infinities and signed zeros included); NaN where the reference has
    NaN, whatever its payload."""
    ours_np = ours.numpy()
    assert ours_np.dtype == np.float32
    assert ours_np.shape == ref.shape
    same = (ours_np.view(np.int32) == ref.view(np.int32)) | (np.isnan(ours_np) & np.isnan(ref))
    if not same.all():
        i = tuple(np.argwhere(~same)[0])
        pytest.fail(f"{int((~same).sum())} values differ; first at {i}: {ours_np[i]!r} vs {ref[i]!r}")


def set_halves(qtype: Q, raw: np.ndarray, halves: list[np.ndarray]) -> None:
    """Write fp16 bit patterns (uint16 [rows, n_blocks] per field) into blocks [rows, n_blocks, bytes]."""
    if qtype == Q.IQ1_M:  # nibble i of d is the top nibble of the uint16 at bytes 48 + 2i, 49 + 2i
        (bits,) = halves
        for i in range(4):
            top = IQ1_M_SCALES + 2 * i + 1
            raw[..., top] = (raw[..., top] & 0x0F) | (((bits >> (4 * i)) & 0x0F) << 4).astype(np.uint8)
        return
    for off, bits in zip(FP16_FIELDS[qtype], halves, strict=True):
        raw[..., off : off + 2] = bits[..., None].view(np.uint8).reshape(*bits.shape, 2)


def n_halves(qtype: Q) -> int:
    return 1 if qtype == Q.IQ1_M else len(FP16_FIELDS[qtype])


def random_blocks(qtype: Q, rows: int, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, n_blocks * bytes]: random bytes with finite random fp16 fields."""
    _, nbytes = SPEC[qtype][0]
    raw = rng.integers(0, 256, size=(rows, n_blocks, nbytes), dtype=np.uint8)
    # random halves with the exponent's top bit cleared: always finite, still all signs and subnormals
    halves = [
        rng.integers(0, 1 << 16, (rows, n_blocks), dtype=np.uint16) & np.uint16(0xBFFF)
        for _ in range(n_halves(qtype))
    ]
    set_halves(qtype, raw, halves)
    return raw.reshape(rows, n_blocks * nbytes)


# -------------------------------------------------------------------------------------------------
# random blocks (hypothesis)

finite_half = st.floats(width=16, allow_nan=False, allow_infinity=False)


@st.composite
def quant_case(draw, qtype: Q):
    (elems, nbytes) = SPEC[qtype][0]
    rows = draw(st.integers(1, 3))
    n_blocks = draw(st.integers(1, 2 if elems == 256 else 4))  # stay well inside hypothesis' buffer
    data = bytearray(draw(st.binary(min_size=rows * n_blocks * nbytes, max_size=rows * n_blocks * nbytes)))
    raw = np.frombuffer(data, dtype=np.uint8).reshape(rows, n_blocks, nbytes).copy()
    halves = [
        np.array(draw(st.lists(finite_half, min_size=rows * n_blocks, max_size=rows * n_blocks)), np.float16)
        .view(np.uint16)
        .reshape(rows, n_blocks)
        for _ in range(n_halves(qtype))
    ]
    set_halves(qtype, raw, halves)
    return raw.reshape(rows, n_blocks * nbytes), n_blocks * elems


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_random_blocks_bit_exact(qtype: Q, data) -> None:
    raw, n_cols = data.draw(quant_case(qtype))
    ref = reference(qtype, raw)
    if qtype != Q.MXFP4:  # finite fp16 scales give finite values (MXFP4's largest exponents overflow)
        assert np.isfinite(ref).all()
    assert_bits_equal(dequantize(qtype, torch.from_numpy(raw), n_cols), ref)


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_synth_blocks_bit_exact(qtype: Q) -> None:
    """The valid blocks `gufo synth` writes (gufo.formats.random_blocks) decode as gguf decodes them."""
    elems, _ = SPEC[qtype][0]
    raw = synth_blocks(qtype, 3 * 8, np.random.default_rng(qtype.value)).reshape(3, -1)
    ref = reference(qtype, raw)
    assert np.isfinite(ref).all()
    assert_bits_equal(dequantize(qtype, torch.from_numpy(raw), 8 * elems), ref)


@pytest.mark.parametrize("qtype", sorted(FLOATS, key=lambda t: t.value), ids=lambda t: t.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_float_types_bit_exact(qtype: Q, data) -> None:
    size = np.dtype(FLOATS[qtype]).itemsize
    rows, cols = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 9))
    raw = data.draw(st.binary(min_size=rows * cols * size, max_size=rows * cols * size))
    raw = np.frombuffer(raw, dtype=np.uint8).reshape(rows, cols * size)
    ref = reference(qtype, raw.view(FLOATS[qtype]) if qtype != Q.BF16 else raw)
    ours = dequantize(qtype, torch.from_numpy(raw.copy()), cols)
    if qtype == Q.F16:  # NaN payloads: numpy and torch may quiet them differently; compare NaN-ness
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(ours.numpy()), nan)
        ref = np.where(nan, np.float32(0), ref)
        ours = torch.where(ours.isnan(), 0.0, ours)
    assert_bits_equal(ours, ref.reshape(rows, cols))


# -------------------------------------------------------------------------------------------------
# larger seeded matrices: every type, the unpacked form, its ranges and the documented expression


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_unpacked_form(qtype: Q) -> None:
    (elems, nbytes), lo, hi, group, has_offset = SPEC[qtype]
    assert block_shape(qtype) == (elems, nbytes)
    raw = random_blocks(qtype, 48, 8, np.random.default_rng(qtype.value))
    k = 8 * elems
    u = unpack(qtype, torch.from_numpy(raw))
    assert isinstance(u, UnpackedBlocks)
    assert u.q.dtype == torch.int8 and u.q.shape == (48, k) and u.q.is_contiguous()
    assert u.group == group
    assert u.scale.dtype == torch.float32 and u.scale.shape == (48, k // group)
    assert (u.offset is not None) == has_offset
    if has_offset:
        assert u.offset.dtype == torch.float32 and u.offset.shape == (48, k // group)
    # 48*8 random blocks reach both ends of the format's integer range and nothing outside it
    assert int(u.q.min()) == lo and int(u.q.max()) == hi

    # the contract, written the way the interface documents it
    expr = u.q.float() * u.scale.repeat_interleave(u.group, -1)
    if u.offset is not None:
        expr = expr + u.offset.repeat_interleave(u.group, -1)
    ref = reference(qtype, raw)
    assert_bits_equal(expr, ref)
    assert_bits_equal(dequantize(qtype, torch.from_numpy(raw), k), ref)


# MXFP4: 17-byte blocks, so rows of an odd number of bytes
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.IQ2_XXS, Q.MXFP4], ids=lambda t: t.name)
def test_chunked_rows_and_odd_layouts(qtype: Q, monkeypatch) -> None:
    elems, _ = SPEC[qtype][0]
    raw = random_blocks(qtype, 37, 3, np.random.default_rng(7))
    ref = reference(qtype, raw)
    monkeypatch.setattr(blocks_mod, "_CHUNK_ELEMENTS", 5 * 3 * elems)  # 5 rows a chunk, last one short
    assert_bits_equal(dequantize(qtype, torch.from_numpy(raw), 3 * elems), ref)
    # numpy input (read-only, like a memmap), a non-contiguous row view, an odd byte offset, 1-D row
    ro = raw.copy()
    ro.flags.writeable = False
    assert_bits_equal(dequantize(qtype, ro, 3 * elems), ref)
    doubled = torch.from_numpy(np.repeat(raw, 2, axis=0))[::2]
    assert not doubled.is_contiguous()
    assert_bits_equal(dequantize(qtype, doubled, 3 * elems), ref)
    shifted = torch.zeros(raw.size + 1, dtype=torch.uint8)
    shifted[1:] = torch.from_numpy(raw).flatten()
    assert_bits_equal(dequantize(qtype, shifted[1:].view(raw.shape), 3 * elems), ref)
    assert_bits_equal(dequantize(qtype, torch.from_numpy(raw[5]), 3 * elems), ref[5])
    assert dequantize(qtype, torch.from_numpy(raw[:0]), 3 * elems).shape == (0, 3 * elems)


@pytest.mark.parametrize("qtype", sorted(FLOATS, key=lambda t: t.value), ids=lambda t: t.name)
def test_float_types_odd_layouts(qtype: Q) -> None:
    values = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    encoded = {
        Q.F32: values,
        Q.F16: values.astype(np.float16),
        Q.BF16: (values.view(np.uint32) >> 16).astype(np.uint16),  # truncated bf16 bit patterns
    }[qtype]
    raw = encoded.view(np.uint8)
    ref = reference(qtype, raw.view(FLOATS[qtype]) if qtype != Q.BF16 else raw)
    shifted = torch.zeros(raw.size + 1, dtype=torch.uint8)
    shifted[1:] = torch.from_numpy(raw).flatten()
    assert_bits_equal(dequantize(qtype, shifted[1:].view(raw.shape), 8), ref.reshape(5, 8))
    assert_bits_equal(dequantize(qtype, raw.view(FLOATS[qtype]), 8), ref.reshape(5, 8))


# -------------------------------------------------------------------------------------------------
# unsupported and malformed input


UNSUPPORTED = [t for t in Q if t not in SUPPORTED_QTYPES]


def test_supported_set() -> None:
    names = {
        "F32",
        "F16",
        "BF16",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ4_NL",
        "IQ4_XS",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ2_S",
        "IQ3_XXS",
        "IQ3_S",
        "IQ1_S",
        "IQ1_M",
        "TQ1_0",
        "TQ2_0",
        "MXFP4",
    }
    assert {t.name for t in SUPPORTED_QTYPES} == names
    assert all(unsupported_reason(t) is None for t in SUPPORTED_QTYPES)


@pytest.mark.parametrize("qtype", UNSUPPORTED, ids=lambda t: t.name)
def test_unsupported_type_raises(qtype: Q) -> None:
    reason = unsupported_reason(qtype)
    assert reason is not None and qtype.name in reason
    elems, nbytes = block_shape(qtype)
    raw = torch.zeros(2, 4 * nbytes, dtype=torch.uint8)
    with pytest.raises(BadInputError, match=qtype.name):
        dequantize(qtype, raw, 4 * elems)
    with pytest.raises(BadInputError, match=qtype.name):
        unpack(qtype, raw)


def test_unsupported_reasons_name_the_family() -> None:
    assert "activations" in unsupported_reason(Q.Q8_K)
    assert "block format" in unsupported_reason(Q.NVFP4)
    assert "999" in unsupported_reason(999)
    with pytest.raises(BadInputError, match="999"):
        dequantize(999, torch.zeros(1, 34, dtype=torch.uint8), 32)


def test_malformed_shapes() -> None:
    with pytest.raises(BadInputError, match="Q4_K"):
        unpack(Q.Q4_K, torch.zeros(2, 143, dtype=torch.uint8))
    with pytest.raises(BadInputError, match="Q8_0"):
        dequantize(Q.Q8_0, torch.zeros(2, 68, dtype=torch.uint8), 32)
    with pytest.raises(BadInputError, match="F16"):
        dequantize(Q.F16, torch.zeros(2, 6, dtype=torch.uint8), 4)
    with pytest.raises(ValueError, match="F16"):
        unpack(Q.F16, torch.zeros(2, 8, dtype=torch.uint8))

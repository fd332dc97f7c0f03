"""Random blocks read back through the `gguf` package's own dequantizers (the reference decoder)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from gufo.formats.random_blocks import random_blocks

Q = GGMLQuantizationType
TYPES = [Q.F16, Q.F32, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
TYPES += [Q.IQ4_NL, Q.IQ4_XS, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ1_M]
TYPES += [Q.TQ1_0, Q.TQ2_0, Q.MXFP4]


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_blocks_decode_to_centered_values_of_the_asked_deviation(qtype):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = 1 << 17 if block_elems == 1 else 4096
    blocks = random_blocks(qtype, n_blocks, np.random.default_rng(1), std=0.02)
    assert blocks.dtype == np.uint8 and blocks.shape == (n_blocks, block_bytes)
    values = dequantize(blocks.reshape(-1), qtype)
    assert values.size == n_blocks * block_elems
    assert np.isfinite(values).all()
    assert values.std() == pytest.approx(0.02, rel=0.03)
    assert abs(values.mean()) < 0.002  # well under a tenth of the deviation
    assert np.abs(values).max() < 0.2  # no outliers from a broken scale field


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda t: t.name)
def test_blocks_follow_std_and_seed(qtype):
    first = random_blocks(qtype, 256, np.random.default_rng(7), std=0.5)
    again = random_blocks(qtype, 256, np.random.default_rng(7), std=0.5)
    other = random_blocks(qtype, 256, np.random.default_rng(8), std=0.5)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    assert dequantize(first.reshape(-1), qtype).std() == pytest.approx(0.5, rel=0.1)


@pytest.mark.parametrize("qtype", [Q.TQ1_0, Q.TQ2_0], ids=lambda t: t.name)
def test_ternary_blocks_hold_only_ternary_digits(qtype):
    """Every stored digit decodes to -1, 0 or 1 (TQ2_0's code 3 and TQ1_0's bytes past 242 would not),
    each a third of the time."""
    values = dequantize(random_blocks(qtype, 256, np.random.default_rng(2)).reshape(-1), qtype)
    per_block = values.reshape(256, -1)
    digits = per_block / np.abs(per_block).max(axis=1, keepdims=True)  # one scale per block
    counts = np.unique(digits, return_counts=True)
    assert np.array_equal(counts[0], [-1, 0, 1])
    assert np.allclose(counts[1] / digits.size, 1 / 3, atol=0.01)


def test_unsupported_type_is_refused():
    with pytest.raises(ValueError, match="NVFP4"):
        random_blocks(Q.NVFP4, 1, np.random.default_rng(0))

"""The AVX2 int8 linear against the torch reference (itself bit-exact with gguf's dequantizers)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from gufo.formats import QUANTIZED_QTYPES
from gufo.formats.random_blocks import random_blocks
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.cpu_int8 import NIBBLES, SIGNED8, UNSIGNED8, CpuInt8Linear
from gufo.kernels.linear_reference import ReferenceLinear

Q = gguf.GGMLQuantizationType
pytestmark = pytest.mark.skipif(not CpuInt8Linear.available(), reason="needs AVX2 and a C compiler")

EXPECTED_LAYOUT = {
    "Q4_0": NIBBLES,
    "Q4_1": NIBBLES,
    "Q4_K": NIBBLES,
    "Q2_K": NIBBLES,
    "Q3_K": NIBBLES,
    "Q5_0": UNSIGNED8,
    "Q5_1": UNSIGNED8,
    "Q5_K": UNSIGNED8,
    "Q6_K": UNSIGNED8,
    "Q8_0": SIGNED8,
    "IQ4_NL": SIGNED8,  # levels -127..113: 241 values do not fit 0..127
    "IQ4_XS": SIGNED8,
    "IQ2_XXS": UNSIGNED8,
    "IQ2_XS": UNSIGNED8,
    "IQ2_S": UNSIGNED8,
    "IQ3_XXS": UNSIGNED8,
    "IQ3_S": UNSIGNED8,
    "IQ1_S": UNSIGNED8,
    "IQ1_M": UNSIGNED8,
    "TQ1_0": NIBBLES,
    "TQ2_0": NIBBLES,
    "MXFP4": UNSIGNED8,
}

# formats the `gguf` package can quantize (the others get random valid blocks)
GGUF_QUANTIZES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def quantized_tensor(qtype: gguf.GGMLQuantizationType, rows: int, cols: int) -> TensorInfo:
    rng = np.random.default_rng(int(qtype))
    if qtype.name not in GGUF_QUANTIZES:
        block_elems, _ = gguf.GGML_QUANT_SIZES[qtype]
        blocks = random_blocks(qtype, rows * cols // block_elems, rng).reshape(rows, -1)
    else:
        data = rng.standard_normal((rows, cols)).astype(np.float32)
        blocks = gguf.quants.quantize(data, qtype)
    return TensorInfo("w", qtype, (rows, cols), 0, blocks.nbytes, blocks)


@pytest.mark.parametrize("qtype", sorted(QUANTIZED_QTYPES, key=int), ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 3, 4, 9])
def test_exact_on_representable_activations(qtype, m):
    """With activations that int8 represents exactly (each 32-block's max is 127), the only error left is
    float32 rounding: the integer dot products and scales must be right for every layout and tile."""
    info = quantized_tensor(qtype, 37, 512)  # odd row count exercises every remainder tile
    weight = CpuInt8Linear.prepare(info)
    assert weight.kind == EXPECTED_LAYOUT[qtype.name]
    x = torch.randint(-127, 128, (m, 512), generator=torch.Generator().manual_seed(m)).float()
    x[:, ::32] = 127.0
    ours = CpuInt8Linear.apply(x, weight).double()
    expected = x.double() @ ReferenceLinear.prepare(info).double().T
    scale = expected.abs().max()
    assert float((ours - expected).abs().max() / scale) < 2e-5


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0, Q.IQ4_XS, Q.IQ1_M], ids=str)
def test_general_activations_within_int8_rounding(qtype):
    info = quantized_tensor(qtype, 64, 1024)
    x = torch.randn(5, 1024, generator=torch.Generator().manual_seed(0))
    ours = CpuInt8Linear.apply(x, CpuInt8Linear.prepare(info))
    expected = x @ ReferenceLinear.prepare(info).T
    # int8 activations: relative error ~ 1/254 per element, averaging down over 1024 terms
    assert float((ours - expected).norm() / expected.norm()) < 0.01

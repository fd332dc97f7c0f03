"""The CPU RMSNorm kernel against its torch reference."""

from __future__ import annotations

import pytest
import torch

from gufo.kernels.norm import CpuRmsNorm, ReferenceRmsNorm

pytestmark = pytest.mark.skipif(not CpuRmsNorm.available(), reason="needs AVX2 and a C compiler")


@pytest.mark.parametrize("shape", [(1, 576), (7, 640), (3, 4, 256), (2, 13)])
def test_matches_reference(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen) * 3
    weight = torch.randn(shape[-1], generator=gen)
    expected = ReferenceRmsNorm.apply(x.double(), weight.double(), 1e-6)
    ours = CpuRmsNorm.apply(x, weight, 1e-6)
    assert ours.shape == x.shape
    assert float((ours.double() - expected).abs().max()) < 1e-5 * float(expected.abs().max())

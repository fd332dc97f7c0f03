"""The float16 row products of rows_half.py (KernelOptions.row_products = "f16"): every weight dequantized
once at load to the `gguf` package's values rounded to float16, each row's numbers whatever rows share its
product, against a float64 oracle; the launch policy that picks them. The dequantizer runs in the Triton
interpreter on CPU (a worker subprocess: triton_interpreter.py); the products run on cuBLAS on real
shapes on a GPU when there is one."""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import gguf
import numpy as np
import pytest
import torch
from test_triton_gemv import GPU_REL, HALF_REL, activations, gpu_rows_alike, products_in_parts, random_tensor
from triton_interpreter import interpreter_tests

from gufo.errors import BadInputError
from gufo.options import KernelOptions

pytest.importorskip("triton")

from gufo.kernels.triton import gemv, launch, planes, rows_half  # noqa: E402  (needs triton)
from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402

Q = gguf.GGMLQuantizationType
FORMATS = (Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS, Q.F32)  # a K-quant, the legacy, a codebook, a float file
LAUNCH = DependentLaunch(enabled=True)
HALF = gemv.TritonLinear(KernelOptions(row_products="f16"))
BATCHES = (1, 3, 16, 20, 40, 64)  # rows per product: parts of the one tile, then the whole of it
REL = HALF_REL[torch.float16]  # activations rounded to float16 (weights are float16 already)


def dequantized(info) -> torch.Tensor:
    """The file's weights as the `gguf` package dequantizes them, float64."""
    if info.qtype == Q.F32:
        return torch.from_numpy(np.asarray(info.data).view(np.float32).reshape(info.shape).astype(np.float64))
    return torch.from_numpy(gguf.quants.dequantize(info.data, info.qtype).astype(np.float64))


def oracle(info, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 x @ W^T and |x| @ |W|^T, W the `gguf` package's weights rounded to float16."""
    w = dequantized(info).half().double()
    return x.double() @ w.T, x.double().abs() @ w.abs().T


def check_rows_alike(qtype: gguf.GGMLQuantizationType) -> None:
    """The weight held as the `gguf` package's values in float16, bit for bit; rows in products of 1, 3,
    16, 20, 40 and 64 rows bit for bit the same per row, and close to the oracle."""
    info = random_tensor(qtype, rows=70)
    weight = HALF.prepare(info)
    assert weight.qtype == Q.F16 and torch.equal(weight.planes[0], dequantized(info).half())
    x = activations(64, info.shape[1]) * torch.logspace(-2, 1, info.shape[1])
    first = products_in_parts(x, weight, BATCHES[0], half_rows=True)
    for rows in BATCHES[1:]:
        got = products_in_parts(x, weight, rows, half_rows=True)
        assert torch.equal(got, first), f"{rows} rows a product differ from one"
    want, scale = oracle(info, x)
    worst = ((first.double() - want).abs() / (REL * scale + 1e-30)).max().item()
    assert torch.isfinite(first).all() and worst <= 1.0, f"error {worst:.3g} x the bound"


def check_linear_takes_64_rows_then_prefill() -> None:
    """The engine's linear kernel with row_products = "f16": a 64-row product on the float16 rows, equal
    per row to that row alone; 65 rows on the prefill route, multiplying the same float16 weights."""
    info = random_tensor(Q.Q4_K, rows=70)
    weight = HALF.prepare(info)
    x = activations(65, info.shape[1])
    y = HALF.apply(x[:64], weight)
    for i in (0, 37, 63):
        assert torch.equal(y[i : i + 1], HALF.apply(x[i : i + 1], weight))
    want, scale = oracle(info, x)
    assert ((y.double() - want[:64]).abs() <= REL * scale[:64] + 1e-30).all()
    prefill = HALF.apply(x, weight)
    assert ((prefill.double() - want).abs() <= REL * scale + 1e-30).all()


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for qtype in FORMATS:
        cases[f"rows_alike-{qtype.name}"] = lambda q=qtype: check_rows_alike(q)
    cases["linear_64_rows_then_prefill"] = check_linear_takes_64_rows_then_prefill
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


# --------------------------------------------------------------------------------------------------
# host-side checks, in this process


def test_half_route_for_every_row_count():
    """`gemv` with half_rows hands 1..64 float rows of an F16 weight to rows_half.product (a recorder
    around it), whose rows each equal that row alone, bit for bit, and the float64 product of the
    float16-rounded operands to float32 accuracy; without half_rows, never; 65 rows are refused."""
    n, k = 96, 128
    dense = torch.randn(n, k).half()
    weight = planes.TritonWeight(Q.F16, (n, k), (dense,))
    x = torch.randn(64, k)
    want = x.half().double() @ dense.double().T
    alone = torch.cat([rows_half.product(x[i : i + 1], dense) for i in range(64)])
    assert torch.allclose(alone.double(), want, rtol=1e-5, atol=1e-4)
    for rows in (1, 2, 17, 63, 64):
        with mock.patch.object(rows_half, "product", wraps=rows_half.product) as recorded:
            y = launch.gemv(x[:rows], weight, 0, LAUNCH, half_rows=True)
        assert recorded.call_count == 1 and y.dtype == torch.float32, rows
        assert torch.equal(y, alone[:rows]), rows
        assert not launch.on_half_rows(weight, rows, False)
    with pytest.raises(ValueError, match="float16 rows: 65 rows, expected 1..64"):
        rows_half.product(torch.zeros(65, k), dense)


def test_linear_kernel_row_limits():
    """With row_products = "f16" products of up to 64 rows stay off the prefill route and keep each row's
    numbers; never int8 rows; the other routes keep 16 rows (64 on the tensor-core int8 rows)."""
    f16 = planes.TritonWeight(Q.F16, (4096, 4096), ())
    q4_k = planes.TritonWeight(Q.Q4_K, (4096, 4096), ())
    vector = gemv.TritonLinear(KernelOptions())
    tensor = gemv.TritonLinear(KernelOptions(row_products="tensor"))
    assert HALF.keeps_rows(f16, 64) and not HALF.keeps_rows(f16, 65) and not HALF.keeps_rows(f16, 0)
    assert not any(HALF.takes_int8(f16, rows) for rows in (1, 16, 64))
    assert launch.skinny(f16, 64, False, False, True) and not launch.skinny(f16, 65, False, False, True)
    assert not launch.skinny(f16, 17, False, False, False)
    assert vector.keeps_rows(q4_k, 16) and not vector.keeps_rows(q4_k, 17)
    assert tensor.keeps_rows(q4_k, 64) and not tensor.keeps_rows(q4_k, 65)
    assert not vector.keeps_rows(f16, 64) and not tensor.keeps_rows(f16, 64)


def test_row_products_option_is_checked():
    with pytest.raises(BadInputError, match="row products: expected one of vector, tensor, f16, got 'mma'"):
        KernelOptions(row_products="mma")


# --------------------------------------------------------------------------------------------------
# the compiled kernels on a GPU, on real shapes (skipped without one)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", (Q.Q4_K, Q.Q6_K), ids=lambda q: q.name)
def test_gpu_rows_alike_real_shapes(qtype):
    """Qwen3-8B widths (K = 4096, 5096 rows: a tail tile, split-K from the device's size): rows in
    products of 1, 5, 16 and 64 rows bit for bit alike, and close to the oracle."""
    info = random_tensor(qtype, rows=4096 + 1000, cols=4096)
    weight = HALF.prepare(info)  # uploaded to the GPU
    x = activations(64, 4096)
    alone = gpu_rows_alike(HALF, weight, x)
    want, scale = oracle(info, x)
    rel = max(GPU_REL[torch.float16], REL)
    assert ((alone.double() - want).abs() <= rel * scale + 1e-30).all()

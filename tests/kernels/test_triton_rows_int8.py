"""The tensor-core products of int8 activation rows (rows_int8.py, KernelOptions.row_products =
"tensor"): each row's numbers whatever rows share its product, against a float64 oracle of the `gguf`
package's dequantized weights; the launch policy that picks them. Kernels run in the Triton interpreter
on CPU (a worker subprocess: triton_interpreter.py), and on real shapes on a GPU when there is one."""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import gguf
import numpy as np
import pytest
import torch
from test_triton_gemv import (
    FLOAT32_REL,
    GPU_REL,
    HALF_REL,
    activations,
    gpu_rows_alike,
    products_in_parts,
    random_tensor,
)
from triton_interpreter import interpreter_tests

from gufo.errors import BadInputError
from gufo.kernels.int8_rows import empty_int8_rows, quantize_rows_reference
from gufo.options import KernelOptions

pytest.importorskip("triton")

from gufo.kernels.triton import gemv, gemv_int8, launch, planes, rows_int8  # noqa: E402  (needs triton)
from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402

Q = gguf.GGMLQuantizationType
FORMATS = (Q.Q4_K, Q.Q6_K, Q.Q8_0)
LAUNCH = DependentLaunch(enabled=True)
TENSOR = gemv.TritonLinear(KernelOptions(int8_min_weights=0, row_products="tensor"))
VECTOR = gemv.TritonLinear(KernelOptions(int8_min_weights=0))
# the bound relative to |x| @ |W|^T: the int8 products' float32 rounding; Q6_K's float16 operands
REL = {Q.Q4_K: FLOAT32_REL, Q.Q8_0: FLOAT32_REL, Q.Q6_K: HALF_REL[torch.float16]}
BATCHES = (1, 3, 16, 20)  # rows per product: one tile, a part of one, a full one, two tiles


def oracle(info, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 x @ W^T and |x| @ |W|^T: W from the `gguf` package's dequantizer, x as the int8 products
    multiply it (its values per 32 columns times their scale: the quantizer's oracle)."""
    w = torch.from_numpy(gguf.quants.dequantize(info.data, info.qtype).astype(np.float64))
    q, scales, _ = quantize_rows_reference(x)
    xd = q.double() * scales.double().repeat_interleave(32, -1)
    return xd @ w.T, xd.abs() @ w.abs().T


def check_rows_alike(qtype: gguf.GGMLQuantizationType, splits: int | None, cols: int | None = None) -> None:
    """Rows in products of 1, 3, 16 and 20 rows: bit for bit the same per row, and close to the oracle;
    float32 rows and the same rows already quantized (`Int8Rows`) alike."""
    info = random_tensor(qtype, cols=cols)
    weight = TENSOR.prepare(info)
    x = activations(20, info.shape[1]) * torch.logspace(-2, 1, info.shape[1])
    x[3, 32:64] = 0.0  # an all-zero block
    first = products_in_parts(x, weight, BATCHES[0], splits=splits, tensor_rows=True)
    for rows in BATCHES[1:]:
        got = products_in_parts(x, weight, rows, splits=splits, tensor_rows=True)
        assert torch.equal(got, first), f"{rows} rows a product differ from one"
    quantized = launch.gemv(gemv_int8.quantize_rows(x, LAUNCH), weight, 0, LAUNCH, splits, tensor_rows=True)
    assert torch.equal(quantized, first)
    want, scale = oracle(info, x)
    worst = ((first.double() - want).abs() / (REL[qtype] * scale + 1e-30)).max().item()
    assert torch.isfinite(first).all() and worst <= 1.0, f"error {worst:.3g} x the bound"


def check_linear_takes_64_rows(qtype: gguf.GGMLQuantizationType) -> None:
    """The engine's linear kernel with row_products = "tensor": a 64-row product on the tensor tiles
    (four of them), equal per row to that row alone."""
    info = random_tensor(qtype)
    weight = TENSOR.prepare(info)
    x = activations(64, info.shape[1])
    y = TENSOR.apply(x, weight)
    for i in (0, 37, 63):
        assert torch.equal(y[i : i + 1], TENSOR.apply(x[i : i + 1], weight))
    want, scale = oracle(info, x)
    assert ((y.double() - want).abs() <= REL[qtype] * scale + 1e-30).all()


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for qtype in FORMATS:
        cases[f"rows_alike-{qtype.name}"] = lambda q=qtype: check_rows_alike(q, None)
    # two K ranges (split-K), Q8_0 with a tail in its second step
    cases["rows_alike-split_k-Q4_K"] = lambda: check_rows_alike(Q.Q4_K, 2)
    cases["rows_alike-split_k-Q8_0"] = lambda: check_rows_alike(Q.Q8_0, 2, cols=19 * 32)
    cases["linear_64_rows-Q6_K"] = lambda: check_linear_takes_64_rows(Q.Q6_K)
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


# --------------------------------------------------------------------------------------------------
# host-side checks, in this process


@pytest.mark.parametrize("qtype", [*FORMATS, Q.IQ4_XS], ids=lambda q: q.name)
def test_tensor_route_only_when_asked(qtype):
    """Which kernel `gemv` launches for 1..64 int8 rows (the launchers replaced by recorders): the
    tensor tiles for the formats that have them, only with tensor_rows, for every row count alike;
    above 64 rows, the vector kernels."""
    weight = planes.TritonWeight(qtype, (40, 512), (torch.empty(0),))
    for rows in (*range(1, 65), 65):
        x = empty_int8_rows(rows, 512, torch.device("cpu"))
        for tensor_rows in (False, True):
            with (
                mock.patch.object(rows_int8, "launch") as tensor,
                mock.patch.object(gemv_int8, "launch") as vector,
            ):
                launch.gemv(x, weight, 0, LAUNCH, tensor_rows=tensor_rows)
            want = tensor_rows and qtype in FORMATS and rows <= 64
            assert tensor.called == want and vector.called == (not want), (rows, tensor_rows)
            if want:
                grid = tensor.call_args.args[4]
                assert grid[2] == -(-rows // rows_int8.BLOCK_M)  # tiles of 16 rows, the last one masked


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_tile_width_leaves_the_k_splits_alone(qtype):
    """Products of 1..64 rows may run on tiles of two widths (TENSOR_WIDE_TILES past TENSOR_NARROW_ROWS
    rows), but `_splits` is asked with the same tile count for every row count, so each row's K ranges,
    hence its summation order, never depend on how many rows share the product."""
    n, k = 4096, 4096
    weight = planes.TritonWeight(qtype, (n, k), (torch.empty(0),))
    asked, widths = set(), set()
    for rows in range(1, 65):
        x = empty_int8_rows(rows, k, torch.device("cpu"))
        with (
            mock.patch.object(rows_int8, "launch") as tensor,
            mock.patch.object(launch, "_splits", return_value=4) as splits,
        ):
            launch.gemv(x, weight, 0, LAUNCH, tensor_rows=True)
        asked.add(splits.call_args.args[1])
        widths.add(tensor.call_args.args[7])
        assert tensor.call_args.args[4][1] == 4  # the grid's splits axis
    assert asked == {-(-n // launch.TENSOR_TILES[qtype][0])}
    assert len(widths) == (2 if qtype in launch.TENSOR_WIDE_TILES else 1)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.IQ4_XS], ids=lambda q: q.name)
def test_linear_kernel_row_limits(qtype):
    """Products of up to 64 rows stay off the prefill route with row_products = "tensor" for the
    formats it has (decode rows), 16 otherwise; int8 rows are taken up to the same limits."""
    weight = planes.TritonWeight(qtype, (4096, 4096), ())
    limit = 64 if qtype in FORMATS else 16
    assert VECTOR.takes_int8(weight, 16) and not VECTOR.takes_int8(weight, 17)
    assert TENSOR.takes_int8(weight, limit) and not TENSOR.takes_int8(weight, limit + 1)
    assert not TENSOR.takes_int8(weight, 0) and launch.skinny(weight, 0, True, True)  # empty input: gemv
    for rows, int8 in ((16, False), (17, True), (64, True), (65, True)):
        assert launch.skinny(weight, rows, int8, False) == (rows <= 16)
        assert launch.skinny(weight, rows, int8, True) == (rows <= (limit if int8 else 16))


def test_row_products_option_is_checked():
    with pytest.raises(BadInputError, match="row products: expected one of vector, tensor, f16, got 'mma'"):
        KernelOptions(row_products="mma")


# --------------------------------------------------------------------------------------------------
# the compiled kernels on a GPU, on real shapes (skipped without one)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_gpu_rows_alike_real_shapes(qtype):
    """Qwen3-8B widths (K = 4096, 5096 rows: a tail tile, split-K from the device's size): rows in
    products of 1, 5, 16 and 64 rows bit for bit alike, and close to the oracle."""
    info = random_tensor(qtype, rows=4096 + 1000, cols=4096)
    weight = TENSOR.prepare(info)
    x = activations(64, 4096)
    alone = gpu_rows_alike(TENSOR, weight, x)
    want, scale = oracle(info, x)
    rel = max(GPU_REL[torch.float32], REL[qtype])
    assert ((alone.double() - want).abs() <= rel * scale + 1e-30).all()

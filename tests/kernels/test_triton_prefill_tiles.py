"""The prefill products on fixed tensor-core tiles (prefill_tiles.py): each row's numbers the same bit for bit
whatever rows share its product, against a float64 oracle within the operands' rounding. In the Triton
interpreter on the CPU (a worker subprocess: triton_interpreter.py), and on real shapes on a GPU when
there is one."""

from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import gguf
import pytest
import torch
from test_triton_gemv import HALF_REL, activations, random_tensor
from triton_interpreter import interpreter_tests

pytest.importorskip("triton")

from gufo.errors import BadInputError  # noqa: E402
from gufo.kernels.triton import gemv, planes, prefill_tiles  # noqa: E402  (needs triton)
from gufo.options import KernelOptions  # noqa: E402

Q = gguf.GGMLQuantizationType

SMALL_TILES = (32, 32, 32, 4, 2, 1)  # the interpreter's: several tiles each way on small shapes
# and K (80) in 3 ranges of 32 columns (the last 16), or 4 (the last empty): partial tiles added in order
SPLIT_TILES = ((32, 32, 32, 4, 2, 3), (32, 32, 32, 4, 2, 4))


def operands(
    m: int, n: int, k: int, dtype: torch.dtype, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-2, 1, k)).to(dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
    return x.to(device), w.to(device)


def check_rows_alike(
    dtype: torch.dtype, n: int, k: int, rows: tuple[int, ...], tiles: tuple[int, ...], device: str = "cpu"
) -> None:
    """Products of the first M rows for each M: every row bit for bit the largest product's, and that one
    within the operands' rounding of the float64 product (K of them summed: the |x| @ |w| bound)."""
    x, w = operands(max(rows), n, k, dtype, device)
    whole = prefill_tiles.product(x, w, tiles)
    for m in rows:
        got = prefill_tiles.product(x[:m].contiguous(), w, tiles)
        assert torch.equal(got, whole[:m]), f"{m} rows: row numbers differ from {max(rows)} rows'"
    want = x.double() @ w.double().T
    bound = HALF_REL[dtype] * (x.double().abs() @ w.double().abs().T) + 1e-30
    worst = ((whole.double() - want).abs() / bound).max().item()
    assert torch.isfinite(whole).all() and worst <= 1.0, f"error {worst:.3g} x the bound"


def check_linear_prefill_on_tiles() -> None:
    """The engine's linear kernel with prefill_products = "tiles": products of more rows than the skinny
    routes take (65 and 100 rows of a Q4_K weight) give each row the same numbers, within the float16
    rounding of the `gguf` package's weights times the rows rounded to float16."""
    info = random_tensor(Q.Q4_K, rows=72)
    linear = gemv.TritonLinear(KernelOptions(prefill_products="tiles"))
    weight = linear.prepare(info)
    x = activations(100, info.shape[1])
    with mock.patch.object(prefill_tiles, "product", wraps=prefill_tiles.product) as tiles:
        whole = linear.apply(x, weight)
        assert torch.equal(linear.apply(x[:65], weight), whole[:65])
    assert tiles.call_count == 2
    w = torch.from_numpy(gguf.quants.dequantize(info.data, info.qtype)).half().double()
    xh = x.half().double()
    bound = HALF_REL[torch.float16] * (xh.abs() @ w.abs().T) + 1e-30
    assert ((whole.double() - xh @ w.T).abs() <= bound).all()


def check_refuses_mixed_operands() -> None:
    x, w = operands(4, 8, 16, torch.float16)
    with pytest.raises(TypeError, match="expected float16 or bfloat16, alike"):
        prefill_tiles.product(x, w.bfloat16())
    with pytest.raises(TypeError, match="expected float16 or bfloat16, alike"):
        prefill_tiles.product(x.float(), w.float())


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    # N and K not multiples of the tile (tails), rows from one to several row tiles with a tail; float16
    # only: Triton 3.6's interpreter multiplies bfloat16 operands as their raw bits (bfloat16 on a GPU)
    rows = (1, 17, 33, 70)
    cases["rows_alike-float16"] = lambda: check_rows_alike(torch.float16, 72, 80, rows, SMALL_TILES)
    for tiles in SPLIT_TILES:
        cases[f"rows_alike-split{tiles[-1]}"] = lambda t=tiles: check_rows_alike(
            torch.float16, 72, 80, rows, t
        )
    cases["linear_prefill_on_tiles"] = check_linear_prefill_on_tiles
    cases["refuses_mixed_operands"] = check_refuses_mixed_operands
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_products_pack_rows_on_the_tiles_with_half_precision_operands_only():
    """`packs_rows` (may several sequences' prefill rows share a product): on the tiles for quantized and
    half-precision weights (float16 or bfloat16 operands), not for float32 weights (their prefill
    multiplies float32, on cuBLAS), never on cuBLAS."""
    tiles = gemv.TritonLinear(KernelOptions(prefill_products="tiles"))
    cublas = gemv.TritonLinear(KernelOptions())
    for qtype, packs in ((Q.Q4_K, True), (Q.Q8_0, True), (Q.F16, True), (Q.BF16, True), (Q.F32, False)):
        weight = planes.TritonWeight(qtype, (4096, 4096), ())
        assert tiles.packs_rows(weight) == packs, qtype.name
        assert not cublas.packs_rows(weight), qtype.name


def test_prefill_products_option_is_checked():
    error = "prefill products: expected one of cublas, tiles, auto, got 'mma'"
    with pytest.raises(BadInputError, match=error):
        KernelOptions(prefill_products="mma")


# --------------------------------------------------------------------------------------------------
# the compiled kernel on a GPU, on a Qwen3-8B layer's shapes (skipped without one)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(4096, 4096), (12288, 4096), (4096, 12288)], ids=str)
@pytest.mark.parametrize("splits", [1, 4], ids=["whole-k", "k-split-4"])
def test_gpu_rows_alike_real_shapes(shape, dtype, splits):
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    n, k = shape
    tiles = (*prefill_tiles.TILES[:-1], splits)
    check_rows_alike(dtype, n, k, (65, 128, 300, 512, 1000, 2048), tiles, "cuda")

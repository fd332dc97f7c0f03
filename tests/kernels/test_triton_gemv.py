"""The Triton skinny-product kernels against the torch reference, run by the Triton interpreter on CPU
(in a worker subprocess: see triton_interpreter.py), and on real shapes on a GPU when there is one."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.formats import block_shape
from gufo.gguf.model_file import TensorInfo
from gufo.kernels import registry
from gufo.kernels.catalog import register_all
from gufo.kernels.contracts import LINEAR
from gufo.kernels.int8_rows import quantize_rows_reference, rounded_rows_reference
from gufo.kernels.linear_reference import ReferenceLinear
from gufo.options import KernelOptions
from gufo.tools.synth.presets import QWEN3_PRESETS

pytest.importorskip("triton")

from gufo.kernels.triton import gemv, gemv_int8, launch, planes, prefill_gemm  # noqa: E402  (needs triton)
from gufo.kernels.triton.decode_candidates import SWEEP_FORMATS, every_candidate  # noqa: E402
from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402

LAUNCH = DependentLaunch(enabled=True)  # dependent launches where the device has them (never here)
DEFAULT_LIMIT = KernelOptions().int8_min_weights
LINEAR_KERNEL = gemv.TritonLinear(KernelOptions())  # what the engine registers
# the int8 kernels also for the tests' small weights, which the engine multiplies on float32
# activations (KernelOptions.int8_min_weights)
INT8_EVERYWHERE = gemv.TritonLinear(KernelOptions(int8_min_weights=0))

Q = gguf.GGMLQuantizationType
IQ_QTYPES = [Q.IQ4_NL, Q.IQ4_XS, Q.IQ3_S, Q.IQ3_XXS, Q.IQ2_XXS]  # every random byte is a valid code
QTYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, *IQ_QTYPES, Q.F32, Q.F16, Q.BF16]
# Byte offsets of the fp16 scale fields of each block (ggml's block structs), written independently of
# the kernel module's field table so that the test checks it.
HALF_OFFSETS = {
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    **{qtype: (0,) for qtype in IQ_QTYPES},
}  # fmt: skip
ROWS = 11  # not a multiple of any BLOCK_N (2..32): every kernel sees a tail tile
FLOAT32_REL = 1e-5  # error bound relative to |x| @ |W|^T: float32 rounding of K <= 512 products
HALF_REL = {torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7}  # + weights rounded to the input dtype
# prefill with float weights multiplies in the weight's precision (activations rounded to it)
FLOAT_PREFILL_REL = {Q.F32: FLOAT32_REL, Q.F16: HALF_REL[torch.float16], Q.BF16: HALF_REL[torch.bfloat16]}


def columns(qtype: gguf.GGMLQuantizationType) -> int:
    """A few blocks: 2 super-blocks of the K-quants, 11 blocks of 32 (tails in the 4- and 8-block steps)."""
    return 512 if block_shape(qtype)[0] == 256 else 11 * 32


def random_tensor(qtype: gguf.GGMLQuantizationType, rows: int = ROWS, cols: int | None = None) -> TensorInfo:
    """Random valid blocks: random bytes with the fp16 scales overwritten by finite values of both signs."""
    rng = np.random.default_rng(int(qtype))
    cols = cols or columns(qtype)
    if qtype in (Q.F32, Q.F16, Q.BF16):
        values = torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32))
        dtype = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}[qtype]
        data = values.to(dtype).view(torch.uint8).numpy()
        return TensorInfo("w", qtype, (rows, cols), 0, data.nbytes, data)
    block_elems, block_bytes = block_shape(qtype)
    blocks = rng.integers(0, 256, (rows, cols // block_elems, block_bytes), dtype=np.uint8)
    for offset in HALF_OFFSETS[qtype]:
        halves = (rng.uniform(-1, 1, blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(*blocks.shape[:2], 2)
    data = blocks.reshape(rows, -1)
    return TensorInfo("w", qtype, (rows, cols), 0, data.nbytes, data)


def activations(m: int, k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)


def gpu_rows_alike(kernel, weight: planes.TritonWeight, x: torch.Tensor) -> torch.Tensor:
    """x @ W^T by `kernel.apply` on the GPU in products of 1, 5, 16 and 64 rows, each row bit for bit
    the same whatever rows share its product: the one-row products, on the CPU."""
    alone = torch.cat([kernel.apply(x[i : i + 1].cuda(), weight) for i in range(64)]).cpu()
    for rows in (5, 16, 64):
        got = torch.cat([kernel.apply(x[i : i + rows].cuda(), weight) for i in range(0, 64, rows)]).cpu()
        assert torch.equal(got, alone), rows
    return alone


def products_in_parts(x: torch.Tensor, weight: planes.TritonWeight, rows: int, **route) -> torch.Tensor:
    """x @ W^T by `launch.gemv` with `route` (its keyword arguments), `rows` rows per product."""
    parts = range(0, x.shape[0], rows)
    return torch.cat([launch.gemv(x[i : i + rows], weight, 0, LAUNCH, **route) for i in parts])


def operands(x: torch.Tensor, info: TensorInfo, int8_min_weights: int) -> torch.Tensor:
    """The activations a product of x multiplies: x itself, or x quantized per 32 columns to int8 and
    dequantized where the vector kernels take int8 activations (gemv_int8.py; its torch quantizer) and
    where prefill rounds them the same way."""
    if not launch.int8_activations(x, planes.TritonWeight(info.qtype, info.shape, ()), int8_min_weights):
        return x
    return rounded_rows_reference(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def check(
    y: torch.Tensor,
    x: torch.Tensor,
    info: TensorInfo,
    rel: float,
    multiplied: torch.Tensor | None = None,
    int8_min_weights: int = DEFAULT_LIMIT,
) -> None:
    """|y - x @ W^T| <= rel * (|x| @ |W|^T) elementwise: a relative bound that holds under cancellation;
    x as the kernel multiplies it (`operands` under the kernel's int8 limit, unless given as
    `multiplied`)."""
    w = ReferenceLinear.prepare(info).double()
    xd = (
        (operands(x, info, int8_min_weights) if multiplied is None else multiplied)
        .reshape(-1, x.shape[-1])
        .double()
    )
    want = (xd @ w.T).reshape(*x.shape[:-1], -1)
    bound = rel * (xd.abs() @ w.abs().T).reshape(want.shape) + 1e-30
    assert y.shape == want.shape and y.dtype == x.dtype, (y.shape, y.dtype)
    assert torch.isfinite(y).all()
    worst = ((y.double() - want).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.3g} x the bound {rel:g} * |x| @ |W|^T"


# --------------------------------------------------------------------------------------------------
# kernel checks, run in the interpreter worker


def check_against_reference(
    qtype: gguf.GGMLQuantizationType, m: int, dtype: torch.dtype = torch.float32
) -> None:
    info = random_tensor(qtype)
    x = activations(m, info.shape[1], dtype)
    rel = FLOAT32_REL if dtype == torch.float32 else HALF_REL[dtype]
    if m > launch.MAX_BLOCK_M:  # the prefill path's operands: float16 for block formats, float weights' own
        rel = FLOAT_PREFILL_REL.get(qtype, HALF_REL[torch.float16])
    check(INT8_EVERYWHERE.apply(x, INT8_EVERYWHERE.prepare(info)), x, info, rel, int8_min_weights=0)


def check_float_activations_below_int8_limit(qtype: gguf.GGMLQuantizationType, m: int) -> None:
    """A weight under the default int8 limit of a format with int8 kernels multiplies float32
    activations as they are, at decode (float32 bound, which the int8 rounding of x, up to 1/254 of a
    block's largest value per element, breaks) and at prefill (float16 operands)."""
    info = random_tensor(qtype)
    weight = LINEAR_KERNEL.prepare(info)
    x = activations(m, info.shape[1])
    assert not LINEAR_KERNEL.takes_int8(weight, m)
    rel = FLOAT32_REL if m <= launch.MAX_BLOCK_M else HALF_REL[torch.float16]
    y = LINEAR_KERNEL.apply(x, weight)
    check(y, x, info, rel, multiplied=x)
    if m <= launch.MAX_BLOCK_M:  # the float32 bound tells int8 rounding apart
        with pytest.raises(AssertionError, match="x the bound"):
            check(y, x, info, rel, multiplied=rounded_rows_reference(x))


def check_split_k(qtype: gguf.GGMLQuantizationType) -> None:
    # K past two 2048-column steps of the vector kernels, with a tail
    info = random_tensor(qtype, cols=4096 + 3 * max(32, block_shape(qtype)[0]))
    weight = LINEAR_KERNEL.prepare(info)
    x = activations(3, info.shape[1])
    check(launch.gemv(x, weight, DEFAULT_LIMIT, LAUNCH, splits=2), x, info, FLOAT32_REL)
    # more splits than K steps
    check(launch.gemv(x, weight, DEFAULT_LIMIT, LAUNCH, splits=64), x, info, FLOAT32_REL)


CANDIDATE_COLS = 5 * 256  # 1, 2 or 3 K steps of the candidates' 2048, 1024 and 512, all but one with a tail


def check_decode_candidate(qtype: gguf.GGMLQuantizationType, config: launch.DecodeConfig) -> None:
    """A launch the bandwidth sweep times (decode_candidates) gives the one-row product within float32
    rounding of the gguf-dequantized weights, on the int8-rounded activations."""
    info = random_tensor(qtype, cols=CANDIDATE_COLS)
    x = activations(1, CANDIDATE_COLS)
    y = launch.gemv(x, INT8_EVERYWHERE.prepare(info), 0, LAUNCH, config=config)
    check(y, x, info, FLOAT32_REL, int8_min_weights=0)


SHARED_GRID_TILE = launch.DecodeConfig(8, 1024, 4)  # 2 row tiles of ROWS, 2 K steps of CANDIDATE_COLS


def check_shared_grid(qtype: gguf.GGMLQuantizationType, m: int) -> None:
    """Decoding.shared_grid changes only where the grid's entries come from: with none, each and all of
    the format's other switches, bit for bit the product without it, and within float32 rounding of the
    gguf-dequantized weights."""
    info = random_tensor(qtype, cols=CANDIDATE_COLS)
    weight = INT8_EVERYWHERE.prepare(info)
    x = activations(m, CANDIDATE_COLS)
    others = [name for name in gemv_int8.DECODING[qtype] if name != "shared_grid"]
    for on in [(), *((name,) for name in others), others]:
        plain = gemv_int8.Decoding(**dict.fromkeys(on, True))
        plain_y, shared_y = (
            launch.gemv(x, weight, 0, LAUNCH, config=replace(SHARED_GRID_TILE, decoding=decoding))
            for decoding in (plain, replace(plain, shared_grid=True))
        )
        assert torch.equal(shared_y, plain_y), on
        check(shared_y, x, info, FLOAT32_REL, int8_min_weights=0)


def check_leading_dims_and_empty_input() -> None:
    info = random_tensor(Q.Q4_K)
    weight = LINEAR_KERNEL.prepare(info)
    x = activations(6, info.shape[1]).reshape(2, 3, -1)
    check(LINEAR_KERNEL.apply(x, weight), x, info, FLOAT32_REL)
    assert LINEAR_KERNEL.apply(x[:0], weight).shape == (0, 3, ROWS)


def check_dequantize(qtype: gguf.GGMLQuantizationType, rows: int = ROWS, cols: int | None = None) -> None:
    """The prefill path's dequant kernel against the `gguf` package's numpy dequantizer."""
    info = random_tensor(qtype, rows, cols)
    want = torch.from_numpy(gguf.quants.dequantize(info.data, qtype).astype(np.float32))
    weight = planes.upload(info, None if torch.cuda.is_available() else torch.device("cpu"))
    got = prefill_gemm.dequantize_weight(weight, torch.float32).cpu()
    assert got.shape == want.shape == info.shape, (got.shape, want.shape)
    torch.testing.assert_close(got, want.reshape(info.shape), rtol=1e-6, atol=1e-30)
    if qtype in IQ_QTYPES:  # products without sums (no fused multiply-add can round differently): exact
        assert torch.equal(got, want.reshape(info.shape))
    half = prefill_gemm.dequantize_weight(
        weight, torch.float16
    ).cpu()  # the prefill operands: round to nearest even
    assert torch.equal(half, got.to(torch.float16))
    brain = prefill_gemm.dequantize_weight(weight, torch.bfloat16).cpu().float()
    if torch.cuda.is_available():  # compiled: round to nearest even, like torch
        assert torch.equal(brain, got.to(torch.bfloat16).float())
    else:  # the interpreter's bf16 conversion may truncate: within one bf16 step
        torch.testing.assert_close(brain, got, rtol=2.0**-7, atol=1e-30)


def check_quantize_rows() -> None:
    """The int8 activation quantizer: bit for bit its torch oracle, and the `gguf` package's Q8_0
    quantizer (the same rule, d = max|x| / 127, stored there as float16)."""
    x = activations(3, 1024) * torch.logspace(-3, 2, 1024)  # blocks of very different magnitudes
    x[1, 64:96] = 0.0  # an all-zero block: d = 0, q = 0
    got = gemv_int8.quantize_rows(x, LAUNCH)
    for mine, oracle in zip(got, quantize_rows_reference(x), strict=True):
        assert torch.equal(mine, oracle)
    xq, xd, xs = got
    blocks = gguf.quants.quantize(x.numpy(), Q.Q8_0).reshape(3, -1, 34)
    assert np.array_equal(blocks[..., 2:].view(np.int8).reshape(3, -1), xq.numpy())
    assert np.array_equal(blocks[..., :2].copy().view(np.float16)[..., 0], xd.numpy().astype(np.float16))
    sums = xq.float().reshape(3, -1, 16).sum(-1) * xd.repeat_interleave(2, -1)
    torch.testing.assert_close(xs, sums, rtol=1e-6, atol=0)


def check_round_rows() -> None:
    """Prefill's activation rounding: bit for bit its torch oracle (the int8 quantizer's values times
    their block scales, rounded to float16), on blocks of very different magnitudes; 37 blocks per row,
    so the second program of a row has a tail."""
    width = 37 * 32
    x = activations(3, width) * torch.logspace(-3, 2, width)
    x[1, 64:96] = 0.0
    want = rounded_rows_reference(x, torch.float16)
    assert torch.equal(gemv_int8.round_rows(x, torch.float16), want)
    # within half a quantization step of x, plus float16's rounding
    step = x.reshape(3, -1, 32).abs().amax(-1).repeat_interleave(32, -1) / 127
    assert ((want.float() - x).abs() <= step / 2 * (1 + 2.0**-20) + x.abs() * 2.0**-11).all()


def check_int8_rows_input(qtype: gguf.GGMLQuantizationType) -> None:
    """A product given rows already quantized (`Int8Rows`, as the fused norms hand them) equals the
    product of the float rows, which it quantizes itself; formats without int8 kernels refuse them."""
    info = random_tensor(qtype)
    weight = INT8_EVERYWHERE.prepare(info)
    x = activations(3, info.shape[1])
    assert INT8_EVERYWHERE.takes_int8(weight, 3) and not INT8_EVERYWHERE.takes_int8(weight, 17)
    assert torch.equal(
        INT8_EVERYWHERE.apply(gemv_int8.quantize_rows(x, LAUNCH), weight), INT8_EVERYWHERE.apply(x, weight)
    )
    other = INT8_EVERYWHERE.prepare(random_tensor(Q.Q4_0))
    assert not INT8_EVERYWHERE.takes_int8(other, 1)
    with pytest.raises(ValueError, match="no int8 kernel"):
        launch.gemv(gemv_int8.quantize_rows(x, LAUNCH), other, 0, LAUNCH)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {}
    for qtype in QTYPES:  # every format and row count (M > 16 takes two row tiles); fewer for IQ*
        for m in (1, 5, 17) if qtype in IQ_QTYPES else (1, 2, 5, 16, 17):
            cases[f"float32-{qtype.name}-m{m}"] = lambda q=qtype, m=m: check_against_reference(q, m)
    # half-precision activations: m >= DOT_MIN_ROWS takes the tl.dot path, which the interpreter runs
    # for float16 only (it multiplies bfloat16 as raw uint16 bits)
    for qtype in (Q.Q4_1, Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.BF16):
        for dtype, rows in ((torch.float16, (1, 5, 16)), (torch.bfloat16, (1,))):
            for m in rows:
                name = f"{str(dtype).removeprefix('torch.')}-{qtype.name}-m{m}"
                cases[name] = lambda q=qtype, m=m, d=dtype: check_against_reference(q, m, d)
    for qtype in IQ_QTYPES:  # the codebook formats' tensor-core kernels
        cases[f"float16-{qtype.name}-m5"] = lambda q=qtype: check_against_reference(q, 5, torch.float16)
    for qtype in (Q.Q4_0, Q.Q8_0, Q.Q5_K, Q.IQ4_NL, Q.F16):
        cases[f"split_k-{qtype.name}"] = lambda q=qtype: check_split_k(q)
    for qtype in launch.INT8_FORMATS:
        for m in (1, 5, 17):
            cases[f"float32-below-int8-limit-{qtype.name}-m{m}"] = lambda q=qtype, m=m: (
                check_float_activations_below_int8_limit(q, m)
            )
    for qtype in QTYPES:
        cases[f"dequant-{qtype.name}"] = lambda q=qtype: check_dequantize(q)
    for qtype in IQ_QTYPES:  # more rows than a dequant program's BLOCK_N, with a tail
        cases[f"dequant-rows-{qtype.name}"] = lambda q=qtype: check_dequantize(q, rows=37)
    for qtype in SWEEP_FORMATS:
        for i, config in enumerate(every_candidate(qtype)):
            cases[f"decode_candidate-{qtype.name}-{i}"] = lambda q=qtype, c=config: check_decode_candidate(
                q, c
            )
    for qtype in gemv_int8.DECODING:
        for m in (1, 5):
            cases[f"shared_grid-{qtype.name}-m{m}"] = lambda q=qtype, m=m: check_shared_grid(q, m)
    cases["leading_dims_and_empty_input"] = check_leading_dims_and_empty_input
    cases["quantize_rows"] = check_quantize_rows
    cases["round_rows"] = check_round_rows
    for qtype in launch.INT8_FORMATS:
        cases[f"int8_rows_input-{qtype.name}"] = lambda q=qtype: check_int8_rows_input(q)
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


# --------------------------------------------------------------------------------------------------
# host-side checks, in this process


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_field_planes_round_trip(qtype):
    info = random_tensor(qtype)
    weight = planes.upload(info, torch.device("cpu"))
    fields = planes.FIELDS[qtype]
    assert sum(f.end - f.start for f in fields) == block_shape(qtype)[1]  # every byte, once
    assert all(p.is_contiguous() for p in weight.planes)
    assert torch.equal(planes.join_fields(qtype, weight.planes), torch.from_numpy(info.data))


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_registered_on_cuda_backend(qtype):
    register_all("cuda", KernelOptions(int8_min_weights=4096))
    route, kernel = registry.lookup("cuda", LINEAR, qtype)
    assert route == "cuda" and isinstance(kernel, gemv.TritonLinear)
    assert kernel.int8_min_weights == 4096  # built with the options registered


def test_register_all_again_re_registers_with_the_new_options():
    for limit in (0, 2**21):
        register_all("cuda", KernelOptions(int8_min_weights=limit, dependent_launch=limit > 0))
        _, kernel = registry.lookup("cuda", LINEAR, Q.Q4_K)
        assert kernel.int8_min_weights == limit and kernel.launch.enabled == (limit > 0)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_int8_activations_only_for_large_weights(qtype):
    """Int8 activations for the formats with int8 kernels on matrices of 2^21 weights and more (the
    smallest of Qwen3-1.7B's, its key and value projections: 1024 x 2048), float32 below (all of
    gemma3-270m's layer matrices: 640 x 2048 at most); float16 activations never."""
    x = torch.empty(1, 2048)
    for shape, large in (((1024, 2048), True), ((1023, 2048), False), ((640, 2048), False)):
        weight = planes.TritonWeight(qtype, shape, ())
        assert launch.int8_activations(x, weight, DEFAULT_LIMIT) == (large and qtype in launch.INT8_FORMATS)
        assert LINEAR_KERNEL.takes_int8(weight, 1) == (large and qtype in launch.INT8_FORMATS)
        assert not launch.int8_activations(x.half(), weight, DEFAULT_LIMIT)


@pytest.mark.parametrize("preset", ["1.7b", "4b", "8b", "14b", "32b"])
def test_every_qwen3_matrix_from_1_7b_up_runs_on_int8(preset):
    """The models whose decode int8 activations were tuned for keep them: the smallest matrix of a Qwen3
    layer (the key or value projection, KV heads x head_dim by hidden, from the HF configs in
    gufo.tools.synth.presets) is at the limit or over it; Qwen3-0.6B's is under."""
    for name, large in ((preset, True), ("0.6b", False)):
        shape = QWEN3_PRESETS[name]
        n, k = shape.num_key_value_heads * shape.head_dim, shape.hidden_size
        assert min(n * k, shape.intermediate_size * k) == n * k
        assert launch.runs_on_int8(planes.TritonWeight(Q.Q4_K, (n, k), ()), DEFAULT_LIMIT) == large


def test_int8_limit_from_the_environment():
    """GUFO_INT8_MIN_WEIGHTS sets the limit (KernelOptions.from_environment)."""
    for value in ("0", "4096"):
        assert KernelOptions.from_environment({"GUFO_INT8_MIN_WEIGHTS": value}).int8_min_weights == int(value)
    assert KernelOptions.from_environment({}).int8_min_weights == 2**21


def test_int8_limit_not_a_whole_number_is_one_error_line():
    """Through the CLI, which builds the kernel options from the environment: exit 2, one line."""
    from tests.conftest import HANG_GUARD_S  # not at the top: the interpreter worker imports this module

    env = {**os.environ, "GUFO_INT8_MIN_WEIGHTS": "-5"}
    command = [sys.executable, "-m", "gufo.cli.main", "kernels", "own", "--target", "sm_90"]
    bad = subprocess.run(command, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("gufo: error: GUFO_INT8_MIN_WEIGHTS='-5': expected a whole number")
    assert bad.stderr.count("\n") == 1


def test_launchers_check_their_operands():
    """Shapes, dtypes and devices are checked before any launch: each mismatch is an error naming it."""
    info = random_tensor(Q.Q4_K)
    weight = planes.upload(info, torch.device("cpu"))
    k = info.shape[1]
    for rows in (1, launch.MAX_BLOCK_M + 1):  # the skinny products and the prefill route
        with pytest.raises(ValueError, match=f"activation columns of a product with a {ROWS}x{k} weight"):
            LINEAR_KERNEL.apply(torch.zeros(rows, k + 32), weight)
        with pytest.raises(TypeError, match="activations: dtype int32"):
            LINEAR_KERNEL.apply(torch.zeros(rows, k, dtype=torch.int32), weight)
        with pytest.raises(ValueError, match="the activations is on meta, expected cpu"):
            LINEAR_KERNEL.apply(torch.zeros(rows, k, device="meta"), weight)
    with pytest.raises(ValueError, match="split-K: 0 splits"):
        launch.gemv(torch.zeros(1, k), weight, DEFAULT_LIMIT, LAUNCH, splits=0)
    with pytest.raises(ValueError, match="no Triton product for Q2_K"):
        LINEAR_KERNEL.apply(torch.zeros(1, k), planes.TritonWeight(Q.Q2_K, (ROWS, k), ()))
    with pytest.raises(TypeError, match="dequantized weight: dtype torch.int8"):
        prefill_gemm.dequantize_weight(weight, torch.int8)
    config = launch.DecodeConfig(4, 1024, 4)  # on float32 activations (under the int8 limit): refused
    with pytest.raises(ValueError, match="DecodeConfig given to a product off the int8 vector kernels"):
        launch.gemv(torch.zeros(1, k), weight, DEFAULT_LIMIT, LAUNCH, config=config)
    with pytest.raises(ValueError, match="decoding switch parity_signs on IQ3_S"):
        gemv_int8.decoding_constexprs(Q.IQ3_S, gemv_int8.Decoding(parity_signs=True))


def test_package_imports_without_triton():
    from tests.conftest import HANG_GUARD_S

    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import gufo.kernels.triton as t\n"
        "from gufo.kernels import registry, linear_reference\n"
        "from gufo.kernels.catalog import register_all\n"
        "from gufo.kernels.contracts import LINEAR\n"
        "from gguf import GGMLQuantizationType as Q\n"
        "assert not t.AVAILABLE\n"
        "register_all('cuda')\n"
        # without Triton the cuda backend falls back to dequantizing on the device
        "kernel = registry.lookup('cuda', LINEAR, Q.Q4_K)[1]\n"
        "assert isinstance(kernel, linear_reference.DeviceDequantLinear)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_GUARD_S)


# --------------------------------------------------------------------------------------------------
# the compiled kernels on a GPU, on real shapes (skipped without one)

GPU_REL = {torch.float32: 1e-4, torch.float16: 2.0**-9, torch.bfloat16: 2.0**-7}  # K = 4096 products


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16, 64], ids=lambda m: f"m{m}")
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_gpu_real_shapes(qtype, m):
    """Qwen3-8B widths: K = 4096, 5096 rows (a tail tile); M > 16 takes the prefill path."""
    info = random_tensor(qtype, rows=4096 + 1000, cols=4096)
    weight = LINEAR_KERNEL.prepare(info)
    for dtype in (torch.float32, torch.bfloat16):
        x = activations(m, 4096, dtype)
        y = LINEAR_KERNEL.apply(x.cuda(), weight).cpu()
        prefill = m > launch.MAX_BLOCK_M  # float16 operands for block formats, float weights' own dtype
        operands = (
            prefill_gemm.FLOAT_PREFILL_DTYPES.get(qtype, prefill_gemm.PREFILL_DTYPE) if prefill else dtype
        )
        check(y, x, info, max(GPU_REL[operands], GPU_REL[dtype]))


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_gpu_dequantize_real_shape(qtype):
    check_dequantize(qtype, rows=4096 + 1000, cols=4096)


@pytest.mark.gpu
def test_gpu_quantize_rows_real_shape():
    """The compiled quantizer and prefill's activation rounding bit for bit their torch oracles on a
    Qwen3-8B FFN width."""
    x = activations(16, 12288) * 10.0
    for mine, oracle in zip(
        gemv_int8.quantize_rows(x.cuda(), LAUNCH), quantize_rows_reference(x), strict=True
    ):
        assert torch.equal(mine.cpu(), oracle)
    rounded = gemv_int8.round_rows(x.cuda(), torch.float16).cpu()
    assert torch.equal(rounded, rounded_rows_reference(x, torch.float16))

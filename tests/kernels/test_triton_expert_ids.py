"""Expert-indexed decode products (launch.gemv with `ExpertRows`, the vector kernels' INDEXED programs),
run by the Triton interpreter on CPU (in a worker subprocess: see triton_interpreter.py): for random
expert ids with repeats, every assignment's row is bit-identical to the plain product of its row with
the chosen expert's matrix alone, and close to the float64 product of gguf's dequantized expert; on
float32 and on int8 activations, for one row shared by every assignment and for one row each."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.formats import block_shape
from gufo.formats.random_blocks import random_blocks
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.int8_rows import rounded_rows_reference

pytest.importorskip("triton")

from gufo.kernels.triton import experts, launch  # noqa: E402  (needs triton)
from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402

Q = gguf.GGMLQuantizationType
N_EXPERTS, ROWS = 6, 11  # 11 rows: not a multiple of any BLOCK_N, every expert's last tile has a tail
IDS = [4, 0, 4, 5, 2, 4]  # an expert three times, one never
FLOAT32_REL = 1e-5  # bound relative to |x| @ |W|^T: float32 rounding of K <= 512 products
LAUNCH = DependentLaunch(enabled=True)  # as the engine launches (no dependent launch off the GPU)
FLOAT = 2**62  # an int8 limit no matrix reaches: float32 activations
INT8 = 0  # int8 activations for every format with int8 kernels


def expert_tensor(qtype: gguf.GGMLQuantizationType) -> TensorInfo:
    """Random valid blocks [N_EXPERTS, ROWS, cols] (gufo.formats.random_blocks)."""
    elements, _ = block_shape(qtype)
    cols = 512 if elements == 256 else 11 * 32  # 2 super-blocks, or 11 blocks: tails in the K steps
    rng = np.random.default_rng(int(qtype))
    blocks = random_blocks(qtype, N_EXPERTS * ROWS * cols // elements, rng)
    data = blocks.reshape(N_EXPERTS, ROWS, -1)
    return TensorInfo("w", qtype, (N_EXPERTS, ROWS, cols), 0, data.nbytes, data)


def oracle(info: TensorInfo) -> torch.Tensor:
    """float64 [N_EXPERTS, ROWS, cols] of gguf's dequantization."""
    values = gguf.quants.dequantize(info.data.reshape(N_EXPERTS * ROWS, -1), info.qtype)
    return torch.from_numpy(np.asarray(values, dtype=np.float64)).reshape(info.shape)


def check(qtype: gguf.GGMLQuantizationType, int8_min_weights: int, shared_row: bool) -> None:
    info = expert_tensor(qtype)
    weight = experts.TritonExpertLinear.prepare(info)
    device = weight.matrices.planes[0].device
    gen = torch.Generator().manual_seed(int(qtype))
    x = torch.randn(1 if shared_row else len(IDS), info.shape[-1], generator=gen).to(device)
    rows = launch.ExpertRows(torch.tensor(IDS, device=device), ROWS)
    got = launch.gemv(x, weight.matrices, int8_min_weights, LAUNCH, experts=rows)
    assert got.shape == (len(IDS), ROWS) and got.dtype == torch.float32
    w = oracle(info)
    int8 = launch.runs_on_int8(weight.expert(0), int8_min_weights)
    for s, e in enumerate(IDS):
        row = x[0 if shared_row else s][None]
        plain = launch.gemv(row, weight.expert(e), int8_min_weights, LAUNCH)
        assert torch.equal(got[s], plain[0]), f"assignment {s}: not the plain product's bits"
        multiplied = (rounded_rows_reference(row.cpu()) if int8 else row.cpu()).double()
        want = multiplied @ w[e].T
        bound = FLOAT32_REL * (multiplied.abs() @ w[e].abs().T) + 1e-30
        worst = ((got[s].cpu().double() - want[0]).abs() / bound[0]).max().item()
        assert worst <= 1.0, f"assignment {s}: error {worst:.3g} x the bound"


def check_int8_limit_of_one_expert() -> None:
    """A limit between one expert's size and the stack's: the indexed product multiplies float32
    activations, as the plain product of one expert does (bit-identical to it)."""
    limit = ROWS * 512 + 1
    check(Q.Q4_K, limit, shared_row=False)


FORMATS = (Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS, Q.Q4_0, Q.F32)


def cases() -> dict[str, tuple[gguf.GGMLQuantizationType, int, bool]]:
    """(format, int8 limit, one shared row) by case name: float32 and (where the format has int8
    kernels) int8 activations, one row for all assignments and one row each."""
    found = {}
    for qtype in FORMATS:
        for shared in (True, False):
            rows = "one-row" if shared else "row-each"
            found[f"float32-{qtype.name}-{rows}"] = (qtype, FLOAT, shared)
            if qtype in launch.INT8_FORMATS:
                found[f"int8-{qtype.name}-{rows}"] = (qtype, INT8, shared)
    return found


def interpreter_cases():
    found = {name: lambda case=case: check(*case) for name, case in cases().items()}
    found["int8-limit-of-one-expert"] = check_int8_limit_of_one_expert
    return found


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(cases()))
def test_gpu_products(case):
    """The compiled kernels (dp4a on NVIDIA): the same bit identity and oracle bound."""
    check(*cases()[case])


@pytest.mark.parametrize(
    ("ids", "x_rows", "message"),
    [
        ([], 1, "0 assignments"),
        (list(range(launch.MAX_ASSIGNMENTS + 1)), 1, "65 assignments"),
        ([1, 2, 3], 2, "3 assignments for 2 activation rows"),
    ],
)
def test_bad_assignments_are_refused(ids, x_rows, message):
    info = expert_tensor(Q.Q8_0)
    weight = experts.TritonExpertLinear.prepare(info, torch.device("cpu"))
    x = torch.zeros(x_rows, info.shape[-1])
    rows = launch.ExpertRows(torch.tensor(ids, dtype=torch.int64), ROWS)
    with pytest.raises(ValueError, match=message):
        launch.gemv(x, weight.matrices, FLOAT, LAUNCH, experts=rows)


def test_rows_must_divide_the_stack():
    info = expert_tensor(Q.Q8_0)
    weight = experts.TritonExpertLinear.prepare(info, torch.device("cpu"))
    rows = launch.ExpertRows(torch.tensor([0]), ROWS + 1)
    with pytest.raises(ValueError, match="no stack of 12-row experts"):
        launch.gemv(torch.zeros(1, info.shape[-1]), weight.matrices, FLOAT, LAUNCH, experts=rows)

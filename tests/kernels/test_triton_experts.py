"""The Triton expert products ("expert_linear" on cuda) against the torch reference's float32 products of
the dequantized experts, run by the Triton interpreter on CPU (in a worker subprocess: see
triton_interpreter.py): the gathered (decode) products for one token's row and for one row per expert,
the grouped (prefill) products; a codebook format (IQ4_XS) too, whose value table is no per-expert
plane. The int8 choice by one expert's size is test_triton_expert_ids'."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.formats import block_shape
from gufo.gguf.model_file import TensorInfo
from gufo.kernels import registry
from gufo.kernels.catalog import register_all
from gufo.kernels.contracts import EXPERT_LINEAR
from gufo.kernels.expert_groups import group_assignments
from gufo.kernels.linear_reference import ReferenceExpertLinear
from gufo.options import KernelOptions

pytest.importorskip("triton")

from gufo.kernels.triton import experts  # noqa: E402  (needs triton)
from gufo.kernels.triton.gemv_kernels import FORMATS  # noqa: E402

Q = gguf.GGMLQuantizationType
N_EXPERTS, ROWS = 5, 7  # 7 rows: every row tile has a tail
CHOSEN = [3, 0, 3, 4]  # an expert twice, some never
COUNTS = [2, 0, 1, 3, 20]  # 20 rows: the dense (prefill) route of the last expert
FLOAT32_REL = 1e-5  # bound relative to |x| @ |W|^T: float32 rounding of K <= 512 products
INT8_REL = 2e-2  # int8 activations (per 32-block scales) against the float32 reference
# the dense route of a block format multiplies float16 operands (prefill_gemm.PREFILL_DTYPE)
FLOAT16_REL = 2.0**-9


def expert_tensor(qtype: gguf.GGMLQuantizationType) -> TensorInfo:
    """Random valid blocks [N_EXPERTS, ROWS, cols]: random codes, small finite float16 scales."""
    rng = np.random.default_rng(int(qtype))
    block_elems, block_bytes = block_shape(qtype)
    cols = 512 if block_elems == 256 else 11 * 32
    if qtype == Q.F32:
        data = rng.standard_normal((N_EXPERTS, ROWS, cols), dtype=np.float32).view(np.uint8)
        return TensorInfo("w", qtype, (N_EXPERTS, ROWS, cols), 0, data.nbytes, data)
    blocks = rng.integers(0, 256, (N_EXPERTS * ROWS, cols // block_elems, block_bytes), dtype=np.uint8)
    offsets = {Q.Q4_K: (0, 2), Q.Q6_K: (208,), Q.IQ4_XS: (0,)}[qtype]  # the fp16 scales (ggml's structs)
    for offset in offsets:
        halves = (rng.uniform(-1, 1, blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(*blocks.shape[:2], 2)
    data = blocks.reshape(N_EXPERTS, ROWS, -1)
    return TensorInfo("w", qtype, (N_EXPERTS, ROWS, cols), 0, data.nbytes, data)


def close(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor, rel: float) -> None:
    assert got.shape == want.shape
    assert bool(((got - want).abs() <= rel * scale + 1e-30).all()), float((got - want).abs().max())


def check(qtype: gguf.GGMLQuantizationType, int8_min_weights: int, rel: float) -> None:
    info = expert_tensor(qtype)
    kernel = experts.TritonExpertLinear(KernelOptions(int8_min_weights=int8_min_weights))
    weight, dense = kernel.prepare(info), ReferenceExpertLinear.prepare(info)
    device = weight.matrices.planes[0].device
    gen = torch.Generator().manual_seed(0)
    chosen = torch.tensor(CHOSEN)
    one = torch.randn(1, info.shape[-1], generator=gen)
    rows = torch.randn(len(CHOSEN), info.shape[-1], generator=gen)
    for x in (one, rows):
        want = ReferenceExpertLinear.gathered(x, dense, chosen)
        scale = ReferenceExpertLinear.gathered(x.abs(), dense.abs(), chosen)
        close(kernel.gathered(x.to(device), weight, chosen.to(device)).cpu(), want, scale, rel)
    grouped = torch.randn(sum(COUNTS), info.shape[-1], generator=gen)
    ids = torch.repeat_interleave(torch.arange(N_EXPERTS), torch.tensor(COUNTS))[:, None]  # sorted
    groups = group_assignments(ids, N_EXPERTS, 16)
    want = ReferenceExpertLinear.grouped(grouped, dense, groups)
    scale = ReferenceExpertLinear.grouped(grouped.abs(), dense.abs(), groups)
    dense_rel = rel if qtype == Q.F32 else max(rel, FLOAT16_REL)
    device_groups = group_assignments(ids.to(device), N_EXPERTS, 16)
    close(kernel.grouped(grouped.to(device), weight, device_groups).cpu(), want, scale, dense_rel)


def interpreter_cases():
    cases = {f"float32-{q.name}": lambda q=q: check(q, KernelOptions().int8_min_weights, FLOAT32_REL)
             for q in (Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.F32)}  # fmt: skip
    # int8 activations wherever one expert is large enough: the gathered products too (the formats'
    # own kernels are test_triton_gemv's; these check the gathering and grouping around them)
    cases["int8-Q4_K"] = lambda: check(Q.Q4_K, 0, INT8_REL)
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda q: q.name)
def test_registered_on_cuda_backend(qtype):
    register_all("cuda")
    route, kernel = registry.lookup("cuda", EXPERT_LINEAR, qtype)
    assert route == "cuda" and isinstance(kernel, experts.TritonExpertLinear)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.F32], ids=lambda q: q.name)
def test_gpu_products(qtype):
    check(qtype, KernelOptions().int8_min_weights, FLOAT32_REL)


@pytest.mark.gpu
def test_gathered_products_replay_in_a_cuda_graph():
    """No host read of the expert ids: a captured product replays for other ids written on the device."""
    info = expert_tensor(Q.Q4_K)
    kernel = experts.TritonExpertLinear(KernelOptions())
    weight, dense = kernel.prepare(info), ReferenceExpertLinear.prepare(info)
    x = torch.randn(len(CHOSEN), info.shape[-1], generator=torch.Generator().manual_seed(1))
    ids = torch.tensor(CHOSEN, device="cuda")
    x_gpu = x.cuda()
    kernel.gathered(x_gpu, weight, ids)  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernel.gathered(x_gpu, weight, ids)
    for chosen in ([1, 2, 3, 4], [0, 0, 4, 2]):
        ids.copy_(torch.tensor(chosen))
        graph.replay()
        want = ReferenceExpertLinear.gathered(x, dense, torch.tensor(chosen))
        scale = ReferenceExpertLinear.gathered(x.abs(), dense.abs(), torch.tensor(chosen))
        close(out.cpu(), want, scale, FLOAT32_REL)

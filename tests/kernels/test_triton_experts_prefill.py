"""The grouped expert products of a prefill (experts_prefill.py, through TritonExpertLinear.grouped) against
float64 products of the experts dequantized by the gguf package, each token's routed experts weighted and
summed: run by the Triton interpreter on CPU (a worker subprocess: see triton_interpreter.py), for every
format with a grouped kernel and every tile height, on the float16 operands (the default int8 limit) and
on int8-rounded activations (for experts of the int8 limit's size); on the GPU also at Qwen3.5-35B-A3B's
expert shapes."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.formats import block_shape
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.expert_groups import TILE_ROWS, group_assignments, tile_rows, weighted_slots
from gufo.options import DEFAULT_INT8_MIN_WEIGHTS, KernelOptions

pytest.importorskip("triton")

from gufo.kernels.triton import experts_prefill  # noqa: E402  (needs triton)
from gufo.kernels.triton.experts import TritonExpertLinear  # noqa: E402

Q = gguf.GGMLQuantizationType
# 8 experts, top-2, 37 tokens, [64, 256] each; expert 3 takes 20 or more rows (several tiles of 16)
SMALL = (8, 2, 37, 64, 256)  # experts, per token, tokens, rows, cols
# bound relative to sum_k w |x| @ |W|^T: the float16 operands (prefill_gemm.PREFILL_DTYPE)
FLOAT16_REL = 2.0**-9
INT8_REL = 2e-2  # int8-rounded activations (per 32-block scales) against the float64 reference
SCALE_OFFSETS = {  # byte offsets of each block's float16 scales (ggml's structs)
    Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
}  # fmt: skip


def expert_tensor(qtype: gguf.GGMLQuantizationType, n_experts: int, rows: int, cols: int) -> TensorInfo:
    """Random valid blocks [n_experts, rows, cols]: random codes, small finite float16 scales."""
    rng = np.random.default_rng(int(qtype))
    block_elems, block_bytes = block_shape(qtype)
    blocks = rng.integers(0, 256, (n_experts * rows, cols // block_elems, block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[qtype]:
        halves = (rng.uniform(-1, 1, blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(*blocks.shape[:2], 2)
    data = blocks.reshape(n_experts, rows, -1)
    return TensorInfo("w", qtype, (n_experts, rows, cols), 0, data.nbytes, data)


def routing(tokens: int, n_experts: int, n_used: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct experts per token, expert 3 the first choice of the first 20 tokens; random weights."""
    gen = torch.Generator().manual_seed(tokens)
    chosen = torch.stack([torch.randperm(n_experts, generator=gen)[:n_used] for _ in range(tokens)])
    chosen[:20, 0] = torch.where((chosen[:20, 1:] == 3).any(-1), chosen[:20, 0], 3)
    return chosen, torch.rand(tokens, n_used, generator=gen)


def check(qtype, shape=SMALL, block_m=None, int8_min_weights=DEFAULT_INT8_MIN_WEIGHTS):
    n_experts, n_used, tokens, rows, cols = shape
    info = expert_tensor(qtype, n_experts, rows, cols)
    options = (
        KernelOptions() if int8_min_weights is None else KernelOptions(int8_min_weights=int8_min_weights)
    )
    kernel = TritonExpertLinear(options)
    weight = kernel.prepare(info)
    device = weight.matrices.planes[0].device
    dense = gguf.quants.dequantize(info.data.reshape(n_experts * rows, -1), qtype)
    dense = torch.from_numpy(dense.astype(np.float64)).reshape(n_experts, rows, cols)
    x = torch.randn(tokens, cols, generator=torch.Generator().manual_seed(1))
    chosen, weights = routing(tokens, n_experts, n_used)
    groups = group_assignments(chosen.to(device), n_experts, block_m or tile_rows(chosen.numel(), n_experts))
    x_dev = x.to(device)
    got = kernel.grouped(x_dev[groups.tokens], weight, groups)
    got = weighted_slots(got[groups.inverse], weights.to(device)).cpu()
    picked = dense[chosen]  # [tokens, k, rows, cols]
    w = weights.double()[..., None]
    want = (w * (picked @ x.double()[:, None, :, None])[..., 0]).sum(1)
    scale = (w * (picked.abs() @ x.double().abs()[:, None, :, None])[..., 0]).sum(1)
    rel = INT8_REL if rows * cols >= int8_min_weights else FLOAT16_REL  # one expert's size decides
    assert got.shape == want.shape
    assert bool(((got.double() - want).abs() <= rel * scale).all()), float((got.double() - want).abs().max())


def interpreter_cases():
    cases = {f"{q.name}": lambda q=q: check(q) for q in experts_prefill.KERNELS}
    cases |= {f"Q4_K-rows{m}": lambda m=m: check(Q.Q4_K, block_m=m) for m in TILE_ROWS[1:]}
    cases["Q6_K-rows64"] = lambda: check(Q.Q6_K, block_m=64)
    cases["int8-Q4_K"] = lambda: check(Q.Q4_K, int8_min_weights=0)  # rounded as the decode's int8 rows
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_other_formats_are_refused():
    info = expert_tensor(Q.Q4_K, 2, 4, 256)
    weight = TritonExpertLinear.prepare(info, torch.device("cpu")).matrices
    float_weight = experts_prefill.TritonWeight(Q.F16, weight.shape, weight.planes[:1])
    groups = group_assignments(torch.zeros(1, 1, dtype=torch.int64), 2, 16)
    with pytest.raises(ValueError, match="F16"):
        experts_prefill.grouped_product(torch.zeros(1, 256, dtype=torch.float16), float_weight, 2, groups)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0], ids=lambda q: q.name)
@pytest.mark.parametrize("tokens", [512, 2048])
def test_gpu_35b_a3b_shapes(qtype, tokens):
    """256 experts, top-8, the gate/up matrices' shape [2 x 512, 2048] (every tile height)."""
    check(qtype, (256, 8, tokens, 1024, 2048))

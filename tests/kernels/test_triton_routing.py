"""The mixture-of-experts glue kernels (gufo.kernels.triton.routing) against their torch references
(gufo.kernels.routing): the router's choice, with ties against a stable sort in float64 numpy (the lower
expert id first), and the weighted sum of the chosen experts' results with the gated shared expert, also
against float64 sums by hand. Kernels run in the Triton interpreter on CPU (a worker subprocess:
triton_interpreter.py), and on a GPU when there is one."""

from __future__ import annotations

from collections.abc import Callable

import gguf
import numpy as np
import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.routing import ReferenceMoeCombine, ReferenceMoeRoute

pytest.importorskip("triton")

from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402  (needs triton)
from gufo.kernels.triton.routing import TritonMoeCombine, TritonMoeRoute  # noqa: E402

KERNEL = TritonMoeRoute(DependentLaunch(enabled=True))
COMBINE = TritonMoeCombine(DependentLaunch(enabled=True))
Q4_K = gguf.GGMLQuantizationType.Q4_K
REL = 1e-6  # float32 rounding of the softmax and the renormalisation, summed in another order


def logits(tokens: int, experts: int, seed: int) -> torch.Tensor:
    return torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed)) * 3.0


def check_against_reference(tokens: int, experts: int, k: int, normalize: bool, device: str = "cpu") -> None:
    x = logits(tokens, experts, seed=experts + k)
    weights, ids = KERNEL.apply(x.to(device), k, normalize)
    want_weights, want_ids = ReferenceMoeRoute.apply(x, k, normalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids.cpu(), want_ids), (ids, want_ids)
    assert torch.allclose(weights.cpu(), want_weights, rtol=REL, atol=0.0), (weights, want_weights)


def check_ties_go_to_the_lower_id() -> None:
    """Equal probabilities, chosen in the order of a stable sort of float64 numpy's softmax."""
    rows = np.array([[0.5, 2.0, 2.0, 1.0, 2.0, -1.0, 1.0, 0.0], [3.0] * 8], dtype=np.float32)
    for k in (1, 3, 5):
        _, ids = KERNEL.apply(torch.from_numpy(rows), k, True)
        e = np.exp(rows.astype(np.float64) - rows.max(-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)
        want = np.argsort(-p, axis=-1, kind="stable")[:, :k]
        assert ids.numpy().tolist() == want.tolist(), (k, ids, want)


def check_non_finite_rows_keep_ids_in_range() -> None:
    x = logits(3, 64, seed=1)
    x[0, 5] = float("nan")
    x[1] = float("-inf")
    _, ids = KERNEL.apply(x, 8, True)
    assert bool(((ids >= 0) & (ids < 64)).all()), ids


def check_combine(tokens: int, k: int, cols: int, shared: bool, device: str = "cpu") -> None:
    """Against the reference, and (float64) each token's slots summed by hand."""
    g = torch.Generator().manual_seed(tokens * 31 + cols)
    y = torch.randn(tokens * k, 2 * cols, generator=g)[:, :cols]  # a strided view, as a product's half
    weights = torch.rand(tokens, k, generator=g)
    # the gate as the router's product hands it: its last column, a strided [T, 1] view
    gates = torch.randn(tokens, 257, generator=g)[:, 256:]
    extra = (torch.randn(tokens, cols, generator=g), gates) if shared else ()
    got = COMBINE.apply(y.to(device), weights.to(device), *(t.to(device) for t in extra)).cpu()
    assert got.dtype == torch.float32 and got.shape == (tokens, cols)
    want = ReferenceMoeCombine.apply(y, weights, *extra)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), (got - want).abs().max()
    by_hand = torch.stack(
        [sum(weights[t, j].double() * y[t * k + j].double() for j in range(k)) for t in range(tokens)]
    )
    if shared:
        by_hand += torch.sigmoid(extra[1].double()) * extra[0].double()
    assert torch.allclose(got.double(), by_hand, rtol=1e-5, atol=1e-5)


def check_route_with_the_shared_id() -> None:
    x = logits(4, 256, seed=3)
    weights, ids = KERNEL.apply(x, 8, True, extra=256)
    want_weights, want_ids = ReferenceMoeRoute.apply(x, 8, True, extra=256)
    assert ids.shape == (4, 9) and torch.equal(ids, want_ids) and bool((ids[:, 8] == 256).all())
    assert torch.equal(ids[:, :8], KERNEL.apply(x, 8, True)[1])
    assert torch.allclose(weights, want_weights, rtol=REL, atol=0.0)


class StubFile:
    """The tensors of one MoE block, as `MoEFFN` reads them from a ModelFile."""

    label = "stub"

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def tensor(self, name: str):
        return self.tensors[name]

    def optional_tensor(self, name: str):
        return self.tensors.get(name)


def q4_k(name: str, shape: tuple[int, ...], seed: int):
    """Random valid Q4_K blocks: random codes, small finite float16 scales (test_triton_experts')."""
    rng = np.random.default_rng(seed)
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    blocks = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    for offset in (0, 2):
        halves = (rng.uniform(-1, 1, blocks.shape[:2]) * 0.01).astype(np.float16)
        blocks[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(*blocks.shape[:2], 2)
    data = blocks.reshape(*shape[:-1], -1)
    return TensorInfo(name, Q4_K, shape, 0, data.nbytes, data)


def check_shared_expert_joins_the_gathered_products() -> None:
    """A decode step with the shared expert as one more gathered expert (expert n): the same output as
    the shared expert's own products (within float32 rounding of sums in another order), and as the
    torch reference's float32 FFN within the int8 activations' rounding."""
    from gufo.kernels.catalog import register_all
    from gufo.models.moe import MoEFFN, MoEShape
    from gufo.options import KernelOptions

    register_all("cuda", KernelOptions(int8_min_weights=0))
    n, k, ff, embd = 6, 2, 256, 256
    p = "blk.0"
    tensors = {
        f"{p}.ffn_gate_inp.weight": q4_k(f"{p}.ffn_gate_inp.weight", (n, embd), 1),
        f"{p}.ffn_gate_inp_shexp.weight": q4_k(f"{p}.ffn_gate_inp_shexp.weight", (1, embd), 2),
        f"{p}.ffn_gate_up_exps.weight": q4_k(f"{p}.ffn_gate_up_exps.weight", (n, 2 * ff, embd), 3),
        f"{p}.ffn_down_exps.weight": q4_k(f"{p}.ffn_down_exps.weight", (n, embd, ff), 4),
        f"{p}.ffn_gate_shexp.weight": q4_k(f"{p}.ffn_gate_shexp.weight", (ff, embd), 5),
        f"{p}.ffn_up_shexp.weight": q4_k(f"{p}.ffn_up_shexp.weight", (ff, embd), 6),
        f"{p}.ffn_down_shexp.weight": q4_k(f"{p}.ffn_down_shexp.weight", (embd, ff), 7),
    }
    shape = MoEShape(n, k, ff, True)
    joined = MoEFFN(StubFile(tensors), p, embd, shape, "cuda")
    assert joined.shared_joins and joined.down.weight.n_experts == n + 1
    apart = MoEFFN(StubFile(tensors), p, embd, shape, "cuda")
    apart.shared_joins = False
    reference = MoEFFN(StubFile(tensors), p, embd, shape, "torch")
    assert not reference.shared_joins
    x = torch.randn(3, embd, generator=torch.Generator().manual_seed(0))
    for rows in (x[:1], x):
        got, alone, want = joined(rows), apart(rows), reference(rows)
        scale = want.abs().max()
        assert torch.allclose(got, alone, rtol=0.0, atol=1e-5 * float(scale)), (got - alone).abs().max()
        assert float((got - want).abs().max()) <= 3e-2 * float(scale), (got - want).abs().max()


def interpreter_cases() -> dict[str, Callable[[], None]]:
    return {
        "route_with_the_shared_id": check_route_with_the_shared_id,
        "shared_expert_joins": check_shared_expert_joins_the_gathered_products,
        "qwen35moe_shape": lambda: check_against_reference(5, 256, 8, True),
        "qwen3next_shape_unnormalised": lambda: check_against_reference(3, 512, 10, False),
        "experts_not_a_power_of_two": lambda: check_against_reference(4, 60, 6, True),
        "one_expert": lambda: check_against_reference(2, 1, 1, True),
        "ties": check_ties_go_to_the_lower_id,
        "non_finite": check_non_finite_rows_keep_ids_in_range,
        "combine_shared": lambda: check_combine(3, 8, 2048, True),
        "combine_one_token_no_shared": lambda: check_combine(1, 8, 100, False),
        "combine_ten_slots": lambda: check_combine(2, 10, 1500, True),
    }


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_bad_top_k_is_refused():
    with pytest.raises(ValueError, match="top 9 of 8 experts"):
        KERNEL.apply(torch.zeros(1, 8), 9, True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_router_shapes():
    for tokens in (1, 8, 512):
        check_against_reference(tokens, 256, 8, True, device="cuda")
    check_against_reference(7, 512, 10, True, device="cuda")
    for tokens in (1, 8, 512):
        check_combine(tokens, 8, 2048, True, device="cuda")

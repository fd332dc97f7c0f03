"""The mixture-of-experts glue kernels (gufo.kernels.triton.routing) against their torch references
(gufo.kernels.routing): the router's choice, with ties against a stable sort in float64 numpy (the lower
expert id first), and the weighted sum of the chosen experts' results with the gated shared expert, also
against float64 sums by hand. Kernels run in the Triton interpreter on CPU (a worker subprocess:
triton_interpreter.py), and on a GPU when there is one."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from triton_interpreter import interpreter_tests

from gufo.kernels.routing import ReferenceMoeCombine, ReferenceMoeRoute

pytest.importorskip("triton")

from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402  (needs triton)
from gufo.kernels.triton.routing import TritonMoeCombine, TritonMoeRoute  # noqa: E402

KERNEL = TritonMoeRoute(DependentLaunch(enabled=True))
COMBINE = TritonMoeCombine(DependentLaunch(enabled=True))
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


def interpreter_cases() -> dict[str, Callable[[], None]]:
    return {
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

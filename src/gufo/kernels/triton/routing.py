"""A mixture-of-experts router's choice in one kernel: one program per token reads its router logits,
takes the softmax over the experts, picks the k largest probabilities one after another (each the first
maximum left, so ties go to the lower id) and writes them, renormalised if asked, with their ids.

In a decode step of the 35B-A3B shape torch ran this as a softmax, a top-k, a sort of the chosen, a sum
and a division per layer: five launches and about 14 us per layer on the H200 (docs/BENCHMARKS.md, "H200,
2026-12-03 (sixth lease)"); here one launch. The oracle is the torch reference (`gufo.kernels.routing`):
the same experts, the weights to float32 rounding (the sums run in another order).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gufo.kernels.contracts import MOE_ROUTE, MoeRouteKernel
from gufo.kernels.registry import Registration
from gufo.kernels.triton.checks import check_dtype
from gufo.kernels.triton.dependent_launch import DependentLaunch, LaunchedKernel, wait_for_inputs

NUM_WARPS = 4


@triton.jit
def moe_route_rows(
    logits_ptr, weights_ptr, ids_ptr, E, stride,
    K: tl.constexpr, NORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """weights[t, :K], ids[t, :K] = the top K of softmax(logits[t, :E]), in descending order."""
    wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    valid = e < E
    x = tl.load(logits_ptr + t * stride + e, mask=valid, other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(valid, p, 0.0)
    p = p / tl.sum(p, 0)
    left = tl.where(valid, p, -1.0)  # probabilities are >= 0: -1 marks the taken and the padding
    j = tl.arange(0, BLOCK_K)
    top = tl.zeros((BLOCK_K,), tl.float32)
    ids = tl.zeros((BLOCK_K,), tl.int64)
    total = 0.0
    for slot in tl.static_range(K):
        best = tl.max(left, 0)
        first = tl.minimum(tl.min(tl.where(left == best, e, BLOCK_E), 0), E - 1)  # NaN rows: an id in range
        top = tl.where(j == slot, best, top)
        ids = tl.where(j == slot, first.to(tl.int64), ids)
        total += best
        left = tl.where(e == first, -1.0, left)
    if NORM:
        top = top / total
    tl.store(weights_ptr + t * K + j, top, mask=j < K)
    tl.store(ids_ptr + t * K + j, ids, mask=j < K)


class TritonMoeRoute(LaunchedKernel, MoeRouteKernel):
    name = "triton-moe-route"

    def apply(self, logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        check_dtype("router logits", logits, (torch.float32, torch.float16, torch.bfloat16))
        rows, experts = logits.shape
        if not 0 < k <= experts:
            raise ValueError(f"router: top {k} of {experts} experts")
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        weights = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
        ids = torch.empty(rows, k, dtype=torch.int64, device=logits.device)
        if rows:
            moe_route_rows[(rows,)](
                logits, weights, ids, experts, logits.stride(0),
                K=k, NORM=normalize, BLOCK_E=triton.next_power_of_2(experts),
                BLOCK_K=triton.next_power_of_2(k), num_warps=NUM_WARPS, **self.launch.options(logits.device),
            )  # fmt: skip
        return weights, ids


def registrations(launch: DependentLaunch) -> tuple[Registration, ...]:
    return (Registration("cuda", MOE_ROUTE, TritonMoeRoute(launch)),)

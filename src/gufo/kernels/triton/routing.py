"""A mixture-of-experts FFN's glue in two kernels.

The router's choice: one program per token reads its router logits, takes the softmax over the experts,
picks the k largest probabilities one after another (each the first maximum left, so ties go to the
lower id) and writes them, renormalised if asked, with their ids.

In a decode step of the 35B-A3B shape torch ran this as a softmax, a top-k, a sort of the chosen, a sum
and a division per layer: five launches and about 14 us per layer on the H200 (docs/BENCHMARKS.md, "H200,
2026-12-03 (sixth lease)"); here one launch. The oracle is the torch reference (`gufo.kernels.routing`):
the same experts, the weights to float32 rounding (the sums run in another order).

The combination: per token and block of columns, the k chosen experts' results times their weights,
summed in slot order, plus the shared expert times the sigmoid of its gate, in one pass (torch: a
product, a sum, a sigmoid, a product and an add per layer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gufo.kernels.contracts import MOE_COMBINE, MOE_ROUTE, MoeCombineKernel, MoeRouteKernel
from gufo.kernels.registry import Registration
from gufo.kernels.triton.checks import check_device, check_dtype, check_size
from gufo.kernels.triton.dependent_launch import DependentLaunch, LaunchedKernel, wait_for_inputs

NUM_WARPS = 4
COMBINE_BLOCK = 1024  # columns per program of the combination


@triton.jit
def moe_route_rows(
    logits_ptr, weights_ptr, ids_ptr, E, stride, extra_id,
    K: tl.constexpr, NORM: tl.constexpr, EXTRA: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """weights[t, :K], ids[t, :K] = the top K of softmax(logits[t, :E]), in descending order; with
    EXTRA, ids[t, K] = extra_id (the ids' rows are K + EXTRA long)."""
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
    if EXTRA:
        ids = tl.where(j == K, extra_id.to(tl.int64), ids)
    tl.store(ids_ptr + t * (K + EXTRA) + j, ids, mask=j < K + EXTRA)


class TritonMoeRoute(LaunchedKernel, MoeRouteKernel):
    name = "triton-moe-route"

    def apply(
        self, logits: torch.Tensor, k: int, normalize: bool, extra: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_dtype("router logits", logits, (torch.float32, torch.float16, torch.bfloat16))
        rows, experts = logits.shape
        if not 0 < k <= experts:
            raise ValueError(f"router: top {k} of {experts} experts")
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        weights = torch.empty(rows, k, dtype=torch.float32, device=logits.device)
        slots = k + (extra is not None)
        ids = torch.empty(rows, slots, dtype=torch.int64, device=logits.device)
        if rows:
            moe_route_rows[(rows,)](
                logits, weights, ids, experts, logits.stride(0), 0 if extra is None else extra,
                K=k, NORM=normalize, EXTRA=extra is not None, BLOCK_E=triton.next_power_of_2(experts),
                BLOCK_K=triton.next_power_of_2(slots), num_warps=NUM_WARPS,
                **self.launch.options(logits.device),
            )  # fmt: skip
        return weights, ids


@triton.jit
def moe_combine_rows(
    y_ptr, w_ptr, shared_ptr, gate_ptr, out_ptr, C, stride_token, stride_slot, stride_shared, stride_gate,
    K: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """out[t, c] = sum over slots j of w[t, j] * y[t, j, c] (+ sigmoid(gate[t]) * shared[t, c]), y's
    rows `stride_token` apart per token and `stride_slot` per slot."""
    wait_for_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = c < C
    acc = tl.zeros((BLOCK,), tl.float32)
    for slot in tl.static_range(K):
        w = tl.load(w_ptr + t * K + slot)
        y = tl.load(y_ptr + t * stride_token + slot * stride_slot + c, mask=valid, other=0.0)
        acc += w * y.to(tl.float32)
    if SHARED:
        g = tl.load(gate_ptr + t * stride_gate).to(tl.float32)
        s = tl.load(shared_ptr + t * stride_shared + c, mask=valid, other=0.0).to(tl.float32)
        acc += s / (1.0 + tl.exp(-g))
    tl.store(out_ptr + t * C + c, acc, mask=valid)


class TritonMoeCombine(LaunchedKernel, MoeCombineKernel):
    name = "triton-moe-combine"

    def apply(
        self,
        y: torch.Tensor,
        weights: torch.Tensor,
        shared: torch.Tensor | None = None,
        shared_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        tokens, k = weights.shape
        if y.dim() == 3:  # [tokens, k, cols], a view (the shared expert's slot left out)
            check_size("expert results per token", y.shape[1], k)
            check_size("expert results (tokens)", y.shape[0], tokens)
        else:
            check_size("expert results (tokens x chosen)", y.shape[0], tokens * k)
        cols = y.shape[-1]
        weights = weights.float().contiguous()
        if y.stride(-1) != 1:
            y = y.contiguous()
        stride_token, stride_slot = (
            (y.stride(0), y.stride(1)) if y.dim() == 3 else (k * y.stride(0), y.stride(0))
        )
        with_shared = shared is not None and shared_gate is not None
        if with_shared:
            check_device("shared expert", shared, y.device)
            check_size("shared expert rows", shared.shape[0], tokens)
            check_size("shared gate rows", shared_gate.shape[0], tokens)
            if shared_gate.dim() > 1:
                check_size("shared gate values per token", shared_gate.shape[1], 1)
            shared = shared if shared.stride(-1) == 1 else shared.contiguous()
        out = torch.empty(tokens, cols, dtype=torch.float32, device=y.device)
        shared, shared_gate = (shared, shared_gate) if with_shared else (y, weights)  # unread without
        if tokens:
            moe_combine_rows[(tokens, triton.cdiv(cols, COMBINE_BLOCK))](
                y, weights, shared, shared_gate, out, cols,
                stride_token, stride_slot, shared.stride(0), shared_gate.stride(0),
                K=k, SHARED=with_shared, BLOCK=COMBINE_BLOCK, num_warps=NUM_WARPS,
                **self.launch.options(y.device),
            )  # fmt: skip
        return out


def registrations(launch: DependentLaunch) -> tuple[Registration, ...]:
    return (
        Registration("cuda", MOE_ROUTE, TritonMoeRoute(launch)),
        Registration("cuda", MOE_COMBINE, TritonMoeCombine(launch)),
    )

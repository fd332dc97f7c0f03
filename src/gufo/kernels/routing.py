"""Torch reference of a mixture-of-experts router's choice ("moe_route"): softmax over the experts, the
top k, optionally renormalised (gufo.models.moe). GPU kernel: `gufo.kernels.triton.routing`."""

from __future__ import annotations

import torch

from gufo.kernels.contracts import MOE_ROUTE, MoeRouteKernel
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


class ReferenceMoeRoute(MoeRouteKernel):
    name = "torch-moe-route"

    @staticmethod
    def apply(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(logits.float(), dim=-1)
        weights, chosen = probs.topk(k, dim=-1)
        if normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, chosen


KERNELS = (Registration(REFERENCE_BACKEND, MOE_ROUTE, ReferenceMoeRoute()),)

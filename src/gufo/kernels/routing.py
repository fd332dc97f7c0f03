"""Torch references of a mixture-of-experts FFN's glue (gufo.models.moe): the router's choice ("moe_route":
softmax over the experts, the top k, optionally renormalised) and the weighted sum of the chosen experts'
results with the gated shared expert ("moe_combine"). GPU kernels: `gufo.kernels.triton.routing`."""

from __future__ import annotations

import torch

from gufo.kernels.contracts import MOE_COMBINE, MOE_ROUTE, MoeCombineKernel, MoeRouteKernel
from gufo.kernels.expert_groups import weighted_slots
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


class ReferenceMoeRoute(MoeRouteKernel):
    name = "torch-moe-route"

    @staticmethod
    def apply(
        logits: torch.Tensor, k: int, normalize: bool, extra: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        probs = torch.softmax(logits.float(), dim=-1)
        weights, chosen = probs.topk(k, dim=-1)
        if normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        if extra is not None:
            chosen = torch.cat((chosen, chosen.new_full((chosen.shape[0], 1), extra)), dim=1)
        return weights, chosen


class ReferenceMoeCombine(MoeCombineKernel):
    name = "torch-moe-combine"

    @staticmethod
    def apply(
        y: torch.Tensor,
        weights: torch.Tensor,
        shared: torch.Tensor | None = None,
        shared_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = weighted_slots(y.float(), weights)
        if shared is not None and shared_gate is not None:
            out = out + torch.sigmoid(shared_gate.float()) * shared.float()
        return out


KERNELS = (
    Registration(REFERENCE_BACKEND, MOE_ROUTE, ReferenceMoeRoute()),
    Registration(REFERENCE_BACKEND, MOE_COMBINE, ReferenceMoeCombine()),
)

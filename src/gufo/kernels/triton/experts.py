"""Expert products on the GPU ("expert_linear" on the "cuda" backend): the 3-D expert tensor uploaded
once as one [n_experts * rows, cols] weight in field planes (planes.py), each expert a row range of it.

  - `gathered` (decode): the expert-indexed vector product (launch.ExpertRows): each assignment's
    programs read its expert's rows in place from the planes by the device-side id, so no weight is
    copied and no routing value reaches the host (the step is captured in a CUDA graph); one row for
    every assignment (gate/up of one token) or one row each (the down projection).
  - `grouped` (prefill): one launch over every assignment, grouped by expert (experts_prefill.py), on
    the prefill's float16 operands; formats without that kernel and ROCm, one product per expert over
    the rows routed to it (TritonLinear's route, the counts read on the host).

Both decide int8 activations by one expert's matrix, so decode and prefill multiply the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.contracts import EXPERT_LINEAR, ExpertLinearKernel
from gufo.kernels.expert_groups import ExpertGroups, per_expert
from gufo.kernels.registry import Registration
from gufo.kernels.triton.experts_prefill import grouped_product, runs_grouped
from gufo.kernels.triton.gemv import TritonLinear
from gufo.kernels.triton.gemv_kernels import FORMATS
from gufo.kernels.triton.launch import (
    MAX_ASSIGNMENTS,
    ExpertRows,
    gemv,
)
from gufo.kernels.triton.planes import FIELDS, TritonWeight, upload
from gufo.kernels.triton.prefill_gemm import PREFILL_DTYPE, prefill_operand
from gufo.options import KernelOptions


@dataclass(frozen=True)
class ExpertWeight:
    matrices: TritonWeight  # [n_experts * rows, cols]
    n_experts: int
    rows: int

    def experts(self, pick: Callable[[torch.Tensor], torch.Tensor]) -> TritonWeight:
        """The matrix of the experts `pick` takes from each field plane viewed [n_experts, rows, -1],
        their rows one after the other; the format's value tables (codebooks) follow the planes whole."""
        w, fields = self.matrices, len(FIELDS[self.matrices.qtype])
        planes = tuple(pick(p.view(self.n_experts, self.rows, -1)).flatten(0, 1) for p in w.planes[:fields])
        return TritonWeight(w.qtype, (planes[0].shape[0], w.shape[1]), planes + w.planes[fields:])

    def expert(self, e: int) -> TritonWeight:
        """Expert e's matrix: row views of the planes (no copy)."""
        return self.experts(lambda plane: plane[e : e + 1])


class TritonExpertLinear(ExpertLinearKernel):
    name = "triton-experts"
    max_assignments = MAX_ASSIGNMENTS
    copies_weights = True  # uploaded to the device once

    def __init__(self, options: KernelOptions) -> None:
        self.linear = TritonLinear(options)

    @staticmethod
    def prepare(info: TensorInfo, device: torch.device | None = None) -> ExpertWeight:
        n_experts, rows, _ = info.shape
        return ExpertWeight(upload(info, device), n_experts, rows)

    def gathered(self, x: torch.Tensor, weight: ExpertWeight, experts: torch.Tensor) -> torch.Tensor:
        rows = ExpertRows(experts, weight.rows)
        return gemv(x, weight.matrices, self.linear.int8_min_weights, self.linear.launch, experts=rows)

    def grouped(self, x: torch.Tensor, weight: ExpertWeight, groups: ExpertGroups) -> torch.Tensor:
        if runs_grouped(weight.matrices.qtype):
            operand = prefill_operand(x, weight.expert(0), PREFILL_DTYPE, self.linear.int8_min_weights)
            return grouped_product(operand, weight.matrices, weight.n_experts, groups).to(x.dtype)
        parts = [self.linear.apply(part, weight.expert(e)) for e, part in per_expert(x, groups)]
        return torch.cat(parts) if parts else x.new_empty(0, weight.rows)


def registrations(options: KernelOptions) -> tuple[Registration, ...]:
    experts = TritonExpertLinear(options)
    return tuple(Registration("cuda", EXPERT_LINEAR, experts, qtype) for qtype in FORMATS)

"""Expert products on the GPU ("expert_linear" on the "cuda" backend): the 3-D expert tensor uploaded
once as one [n_experts * rows, cols] weight in field planes (planes.py), each expert a row range of it.

  - `gathered` (decode): the chosen experts' rows copied out of the planes by their device-side ids
    (index_select), then one skinny product over them: no routing value reaches the host, so the step
    is captured in a CUDA graph. With one row per expert (the down projection) the product computes
    every row against every chosen expert and keeps the diagonal blocks: a few times the arithmetic of
    a memory-bound product, the weights read once.
  - `grouped` (prefill): one launch over every assignment, grouped by expert (experts_prefill.py), on
    the prefill's float16 operands; formats without that kernel, ROCm, and int8 rows on the tensor-core
    rows (row_products "tensor"), one product per expert over the rows routed to it (TritonLinear's
    route, the counts read on the host).

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
from gufo.kernels.triton.launch import MAX_BLOCK_M, gemv, int8_activations, on_tensor_rows, runs_on_int8
from gufo.kernels.triton.planes import FIELDS, TritonWeight, upload
from gufo.kernels.triton.prefill_gemm import PREFILL_DTYPE, prefill_operand
from gufo.options import KernelOptions

NEVER_INT8 = 2**62  # an int8 limit no matrix reaches


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
    max_assignments = MAX_BLOCK_M

    def __init__(self, options: KernelOptions) -> None:
        self.linear = TritonLinear(options)

    @staticmethod
    def prepare(info: TensorInfo, device: torch.device | None = None) -> ExpertWeight:
        n_experts, rows, _ = info.shape
        return ExpertWeight(upload(info, device), n_experts, rows)

    def gathered(self, x: torch.Tensor, weight: ExpertWeight, experts: torch.Tensor) -> torch.Tensor:
        n, r = experts.shape[0], weight.rows
        if not 0 < n <= self.max_assignments or x.shape[0] not in (1, n):
            raise ValueError(f"gathered expert product: {n} experts for {x.shape[0]} rows")
        picked = weight.experts(lambda plane: plane.index_select(0, experts))
        y = gemv(x, picked, self._int8_limit(weight), self.linear.launch)  # [x rows, n * r]
        if x.shape[0] == 1:
            return y.reshape(n, r)
        return y.reshape(n, n, r).diagonal(dim1=0, dim2=1).T.contiguous()

    def grouped(self, x: torch.Tensor, weight: ExpertWeight, groups: ExpertGroups) -> torch.Tensor:
        expert = weight.expert(0)
        int8 = int8_activations(x, expert, self.linear.int8_min_weights)
        # on the tensor-core rows (KernelOptions.row_products "tensor") prefill rows keep decode's numbers
        if runs_grouped(weight.matrices.qtype) and not on_tensor_rows(
            expert, x.shape[0], int8, self.linear.tensor_rows
        ):
            operand = prefill_operand(x, expert, PREFILL_DTYPE, self.linear.int8_min_weights)
            return grouped_product(operand, weight.matrices, weight.n_experts, groups).to(x.dtype)
        parts = [self.linear.apply(part, weight.expert(e)) for e, part in per_expert(x, groups)]
        return torch.cat(parts) if parts else x.new_empty(0, weight.rows)

    def _int8_limit(self, weight: ExpertWeight) -> int:
        """The int8 limit that gives the gathered product one expert's choice (`runs_on_int8`)."""
        return 0 if runs_on_int8(weight.expert(0), self.linear.int8_min_weights) else NEVER_INT8


def registrations(options: KernelOptions) -> tuple[Registration, ...]:
    experts = TritonExpertLinear(options)
    return tuple(Registration("cuda", EXPERT_LINEAR, experts, qtype) for qtype in FORMATS)

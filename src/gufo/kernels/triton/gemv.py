"""The Triton linear kernel ("linear" on the "cuda" backend, every format of gemv_kernels): skinny
products (launch.py) for decode and small batches, the dense route (prefill_gemm.py) above
launch.MAX_BLOCK_M rows (MAX_TENSOR_ROWS on the tensor-core rows: `launch.skinny`)."""

from __future__ import annotations

import torch

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.contracts import LINEAR, LinearKernel
from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.registry import Registration
from gufo.kernels.triton.dependent_launch import DependentLaunch
from gufo.kernels.triton.gemv_kernels import FORMATS
from gufo.kernels.triton.launch import gemv, int8_activations, skinny, takes_int8_rows
from gufo.kernels.triton.planes import TritonWeight, upload
from gufo.kernels.triton.prefill_gemm import prefill_product
from gufo.options import KernelOptions


class TritonLinear(LinearKernel):
    name = "triton-gemv"

    def __init__(self, options: KernelOptions) -> None:
        self.int8_min_weights = options.int8_min_weights
        self.launch = DependentLaunch(options.dependent_launch)
        self.tensor_rows = options.row_products == "tensor"

    @staticmethod
    def prepare(info: TensorInfo, device: torch.device | None = None) -> TritonWeight:
        return upload(info, device)

    def takes_int8(self, weight: TritonWeight, rows: int) -> bool:
        return takes_int8_rows(weight, rows, self.int8_min_weights, self.tensor_rows)

    def apply(self, x: torch.Tensor | Int8Rows, weight: TritonWeight) -> torch.Tensor:
        if isinstance(x, Int8Rows) or skinny(
            weight,
            x.numel() // weight.shape[1],
            int8_activations(x, weight, self.int8_min_weights),
            self.tensor_rows,
        ):
            return gemv(x, weight, self.int8_min_weights, self.launch, tensor_rows=self.tensor_rows)
        return prefill_product(x, weight, self.int8_min_weights)


def registrations(options: KernelOptions) -> tuple[Registration, ...]:
    linear = TritonLinear(options)
    return tuple(Registration("cuda", LINEAR, linear, qtype) for qtype in FORMATS)

"""The Triton linear kernel ("linear" on the "cuda" backend, every format of gemv_kernels): skinny
products (launch.py) for decode and small batches, the dense route (prefill_gemm.py) above
launch.MAX_BLOCK_M rows (MAX_TENSOR_ROWS on the tensor-core rows, MAX_HALF_ROWS on the float16 ones:
`launch.skinny`). With KernelOptions.row_products = "f16" every weight is dequantized to float16 once,
at load (`prepare`), and multiplied in that form on every route."""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.contracts import LINEAR, LinearKernel
from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.registry import Registration
from gufo.kernels.triton.dependent_launch import DependentLaunch
from gufo.kernels.triton.gemv_kernels import FORMATS
from gufo.kernels.triton.launch import (
    MAX_BLOCK_M,
    gemv,
    int8_activations,
    on_half_rows,
    skinny,
    takes_int8_rows,
)
from gufo.kernels.triton.planes import TritonWeight, upload
from gufo.kernels.triton.prefill_gemm import dequantize_weight, on_tiles, prefill_product
from gufo.options import KernelOptions


class TritonLinear(LinearKernel):
    name = "triton-gemv"

    def __init__(self, options: KernelOptions) -> None:
        self.int8_min_weights = options.int8_min_weights
        self.launch = DependentLaunch(options.dependent_launch)
        self.tensor_rows = options.row_products == "tensor"
        # NVIDIA only (launch.on_half_rows): on ROCm the weights stay as the file has them
        self.half_rows = options.row_products == "f16" and torch.version.hip is None
        self.tile_prefill = options.prefill_products == "tiles" and torch.version.hip is None  # so too

    def prepare(self, info: TensorInfo, device: torch.device | None = None) -> TritonWeight:
        weight = upload(info, device)
        if not self.half_rows or weight.qtype == GGMLQuantizationType.F16:
            return weight
        dense = dequantize_weight(weight, torch.float16)  # prefill's dequantizer: its float16 values
        return TritonWeight(GGMLQuantizationType.F16, weight.shape, (dense,))

    def takes_int8(self, weight: TritonWeight, rows: int) -> bool:
        return takes_int8_rows(weight, rows, self.int8_min_weights, self.tensor_rows)

    def keeps_rows(self, weight: TritonWeight, rows: int) -> bool:
        """Up to MAX_BLOCK_M rows on the skinny products; as many as the int8 rows take (the tensor-core
        tiles: MAX_TENSOR_ROWS); on the float16 rows MAX_HALF_ROWS."""
        return (
            0 < rows <= MAX_BLOCK_M
            or self.takes_int8(weight, rows)
            or on_half_rows(weight, rows, self.half_rows)
        )

    def packs_rows(self, weight: TritonWeight) -> bool:
        """On the fixed tiles (`--prefill-products tiles`, NVIDIA) with half-precision operands; cuBLAS
        picks its kernel by the shape (docs/decisions.md, "Packed prefill")."""
        return on_tiles(weight, self.tile_prefill)

    def apply(self, x: torch.Tensor | Int8Rows, weight: TritonWeight) -> torch.Tensor:
        if isinstance(x, Int8Rows) or skinny(
            weight,
            x.numel() // weight.shape[1],
            int8_activations(x, weight, self.int8_min_weights),
            self.tensor_rows,
            self.half_rows,
        ):
            return gemv(
                x,
                weight,
                self.int8_min_weights,
                self.launch,
                tensor_rows=self.tensor_rows,
                half_rows=self.half_rows,
            )
        return prefill_product(x, weight, self.int8_min_weights, self.tile_prefill)


def registrations(options: KernelOptions) -> tuple[Registration, ...]:
    linear = TritonLinear(options)
    return tuple(Registration("cuda", LINEAR, linear, qtype) for qtype in FORMATS)

"""Decode products of 1..MAX_HALF_ROWS rows on float16 weights held dequantized on the device
(KernelOptions.row_products = "f16"): one cuBLAS product of exactly BLOCK_M rows, whatever M is.

cuBLAS picks its kernel, and with it each output's summation order, by the problem's shape, so rows in
products of different row counts get different numbers (measured: docs/BENCHMARKS.md, "H100, 2026-12-07
(third lease)"). Here the shape never changes: the M rows are rounded to float16 into the first rows of
a BLOCK_M-row operand, the rest left as they are (a row's output depends on that row alone, and the
spare rows' outputs are dropped), and the product of those BLOCK_M rows with float32 accumulation and
float32 out is taken, so every row gets its M = 1 numbers (batch invariance by a fixed shape). At 64
rows the product is still bound by reading the weights, so one row costs what 64 do: the route exists
for the steps of many rows (docs/decisions.md, "Float16 decode rows").

Not the numbers of the quantized routes (their activations are int8): the engine takes one route for all
its products (KernelOptions.row_products). NVIDIA only: ROCm keeps the weights as the file has them.
"""

from __future__ import annotations

import torch
from gguf import GGMLQuantizationType

Q = GGMLQuantizationType

BLOCK_M = 64  # the rows of every product on this route (spare ones past M)
MAX_HALF_ROWS = BLOCK_M  # most rows per product on this route (decode rows)
HALF_ROW_FORMATS = (Q.F16,)  # the weights this route multiplies (TritonLinear makes every weight one)


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] (1 <= M <= BLOCK_M; any float dtype) @ weight^T (float16 [N, K]) -> [M, N] float32, in a
    product of BLOCK_M rows of x rounded to float16. On CUDA cuBLAS's float32 accumulators come out as
    they are (out_dtype); elsewhere (the CPU tests) the float16 operands multiply in float32."""
    m, k = x.shape
    if not 0 < m <= BLOCK_M:
        raise ValueError(f"float16 rows: {m} rows, expected 1..{BLOCK_M}")
    rows = torch.empty(BLOCK_M, k, dtype=torch.float16, device=x.device)
    rows[:m].copy_(x)
    if x.device.type == "cuda":
        y = torch.mm(rows, weight.T, out_dtype=torch.float32)
    else:
        y = rows.float() @ weight.float().T
    return y[:m]

"""The prefill route of the Triton products (M > launch.MAX_BLOCK_M rows): dequantize the matrix on the
device (one Triton pass of the format's tile code), then one cuBLAS product on the tensor cores with
float32 accumulation (docs/decisions.md, "Prefill products: dequantize, then cuBLAS")."""

from __future__ import annotations

import torch
import triton
from gguf import GGMLQuantizationType

from gufo.kernels.triton import gemv_int8, prefill_tiles
from gufo.kernels.triton.gemv_kernels import FORMATS
from gufo.kernels.triton.launch import NUM_WARPS, check_operands, int8_activations
from gufo.kernels.triton.planes import TritonWeight

Q = GGMLQuantizationType

# Operands of the prefill product for block formats: float16 has 3 more mantissa bits than bfloat16 at
# the same tensor-core rate, and the weights' own scales are float16 (docs/decisions.md, "float16
# prefill operands"). Activations past float16's range become inf: non-finite logits, which every check
# reports.
PREFILL_DTYPE = torch.float16
# float weights multiply in their own precision at prefill, so the file's values reach the product as
# they are (bf16 would round F16/F32 weights; found on an F32 qwen35 file: logits 1.2 off the CPU)
FLOAT_PREFILL_DTYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
DEQUANT_BLOCK_N = 32  # output rows per program of the dequant kernels (one K step each)
DEQUANT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def dequantize_weight(weight: TritonWeight, dtype: torch.dtype = PREFILL_DTYPE) -> torch.Tensor:
    """The whole matrix [N, K] in `dtype`, dequantized on the device by the format's Triton kernel
    (the tensor-core gemv's tile code; the codebook formats' own kernels, codebook_dequant, which
    store in column order): the same values as the gemv's tiles, so both round identically before
    the product."""
    if weight.qtype not in FORMATS:
        raise ValueError(f"no Triton dequantizer for {weight.qtype.name} weights")
    if dtype not in DEQUANT_DTYPES:
        raise TypeError(f"dequantized weight: dtype {dtype}, expected float32, float16 or bfloat16")
    n, k = weight.shape
    fmt = FORMATS[weight.qtype]
    out = torch.empty(n, k, dtype=dtype, device=weight.planes[0].device)
    n_steps = triton.cdiv(k, fmt.step)
    if n:
        fmt.dequant_kernel[(triton.cdiv(n, DEQUANT_BLOCK_N), n_steps, 1)](
            *weight.planes, out, n, k, n_steps, BLOCK_N=DEQUANT_BLOCK_N, STEP=fmt.step, num_warps=NUM_WARPS
        )
    return out


def _product(x: torch.Tensor, dense: torch.Tensor, tiles: bool = False) -> torch.Tensor:
    """x @ dense^T, float32 out: with `tiles` (half-precision operands: `on_tiles`) on gufo's fixed tiles
    (prefill_tiles.product; its rows the same at any row count); else for half-precision operands on
    CUDA straight from cuBLAS's float32 accumulators (out_dtype, no rounding of the result and no
    conversion pass); elsewhere (float32 operands, ROCm, the CPU interpreter) the product's own result
    widened."""
    x2 = x.reshape(-1, x.shape[-1])
    if tiles:
        y = prefill_tiles.product(x2 if x2.stride(-1) == 1 else x2.contiguous(), dense)
    elif x.dtype != torch.float32 and x.device.type == "cuda" and torch.version.hip is None:
        y = torch.mm(x2, dense.T, out_dtype=torch.float32)
    else:
        y = (x2 @ dense.T).float()
    return y.reshape(*x.shape[:-1], -1)


def prefill_operand(
    x: torch.Tensor, weight: TritonWeight, dtype: torch.dtype, int8_min_weights: int
) -> torch.Tensor:
    """x as the prefill product multiplies it, in dtype. Where decode multiplies int8 activations
    (`launch.int8_activations`), x is first rounded to those same values, so both paths compute one
    function up to float16 weights and summation order."""
    if not int8_activations(x, weight, int8_min_weights):
        return x.to(dtype)
    rows = x.reshape(-1, x.shape[-1])
    return gemv_int8.round_rows(rows if rows.stride(-1) == 1 else rows.contiguous(), dtype).reshape(x.shape)


def prefill_dtype(weight: TritonWeight) -> torch.dtype:
    """The operands' dtype of the weight's prefill product: the weight's own for float weights, else
    PREFILL_DTYPE."""
    return FLOAT_PREFILL_DTYPES.get(weight.qtype, PREFILL_DTYPE)


def on_tiles(weight: TritonWeight, tiles: bool) -> bool:
    """Whether the weight's prefill product runs on gufo's fixed tiles (`_product`): asked for, and
    half-precision operands."""
    return tiles and prefill_dtype(weight) in prefill_tiles.OPERAND_DTYPES


def prefill_product(
    x: torch.Tensor, weight: TritonWeight, int8_min_weights: int, tiles: bool = False
) -> torch.Tensor:
    """x [..., K] @ W^T in x's dtype, through the dense matrix (`dequantize_weight`); with `tiles` on
    gufo's fixed tiles where the operands are half precision (`_product`)."""
    check_operands(x, weight)
    dtype = prefill_dtype(weight)
    operand = prefill_operand(x, weight, dtype, int8_min_weights)
    dense = weight.planes[0] if weight.qtype == Q.F16 else dequantize_weight(weight, dtype)  # F16: as it is
    return _product(operand, dense, on_tiles(weight, tiles)).to(x.dtype)

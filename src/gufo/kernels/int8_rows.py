"""Activations quantized per 32 columns to int8, the input of the int8 products (what llama.cpp calls
q8_1 blocks): d = max|x| / 127, q = x / d rounded half to even, and d * (sum of q) per 16 columns, which
carries the weights' offsets (Q4_K minimums, Q6_K's -32) through one multiply.

A fused row kernel (RMSNorm, gated activation) may hand these to the next product instead of float32
rows, saving the quantizer's launch; the torch quantizer here is every quantizer's oracle.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

ACT_BLOCK = 32  # activation columns per int8 scale


class Int8Rows(NamedTuple):
    values: torch.Tensor  # int8 [M, K]
    scales: torch.Tensor  # float32 [M, K / 32]
    sums: torch.Tensor  # float32 [M, K / 16]: scale * (sum of values) per 16 columns

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device


def empty_int8_rows(rows: int, width: int, device: torch.device) -> Int8Rows:
    blocks = width // ACT_BLOCK
    return Int8Rows(
        torch.empty(rows, width, dtype=torch.int8, device=device),
        torch.empty(rows, blocks, device=device),
        torch.empty(rows, 2 * blocks, device=device),
    )


def row_outputs(
    rows: int, width: int, device: torch.device, int8: bool
) -> tuple[Any, tuple[torch.Tensor, ...]]:
    """The output of a kernel that writes [rows, width] float32 or, with `int8`, `Int8Rows`; and the
    four pointers such a kernel takes (float out, int8 values, scales, sums: the unused ones alias)."""
    if int8:
        if width % ACT_BLOCK:
            raise ValueError(f"int8 rows need a width that is a multiple of {ACT_BLOCK}, got {width}")
        out = empty_int8_rows(rows, width, device)
        return out, (out.scales, *out)
    out = torch.empty(rows, width, dtype=torch.float32, device=device)
    return out, (out, out, out, out)


def quantize_rows_reference(x: torch.Tensor) -> Int8Rows:
    """x [M, K] (K a multiple of 32) quantized per 32 columns: the oracle of the Triton quantizers."""
    m = x.shape[0]
    blocks = x.float().reshape(m, -1, ACT_BLOCK)
    d = blocks.abs().amax(-1) / 127.0
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(blocks * inverse[..., None])  # half to even
    sums = q.reshape(m, -1, 2, 16).sum(-1)
    return Int8Rows(q.to(torch.int8).reshape(m, -1), d, (d[..., None] * sums).reshape(m, -1))


def rounded_rows_reference(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [M, K] as the int8 products multiply it: each value q * d of its 32-column block, in dtype
    (the oracle of the prefill's activation rounding, gemv_int8.round_rows)."""
    xq, xd, _ = quantize_rows_reference(x)
    return (xq.float().reshape(xq.shape[0], -1, ACT_BLOCK) * xd[..., None]).reshape(x.shape).to(dtype)


def as_int8_rows(x: torch.Tensor) -> Int8Rows:
    """x [..., K] as `Int8Rows` of its rows (the references' `int8` outputs)."""
    return quantize_rows_reference(x.reshape(-1, x.shape[-1]))

"""The weight layout of the Triton products ("field planes", made once at load by `upload`).

Each GGUF block is a packed struct (fp16 scales, then quant bytes); the kernels read each field from its
own contiguous plane instead, row-major [N, n_blocks * field bytes], fp16 fields viewed as float16 and
Q5_0's 4 high-bit bytes as one int32. That is a pure byte permutation of the file (`split_fields`;
joining the planes block by block gives the file's bytes back), so a row tile's quant bytes are one
contiguous, aligned run that loads in wide vectors, which the 18/20/22/34-byte structs of the
32-element formats prevent. F16/BF16/F32 weights keep their own dtype ([N, K]).

The codebook formats (IQ*) also take their value tables, as small device tensors after the planes
(`tables`, from gufo.formats.codebooks, never retyped): the IQ4 levels as float32, each lattice point
of the IQ2/IQ3 grids as its little-endian int32 word(s) of 4 byte-sized values, and the sign patterns
as gguf's `ksigns` bytes (bit j: the sign of element j of 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from gguf import GGMLQuantizationType

from gufo.formats import block_shape, codebooks
from gufo.gguf.model_file import TensorInfo
from gufo.kernels.linear_reference import raw_rows

Q = GGMLQuantizationType


@dataclass(frozen=True)
class Field:
    start: int  # byte range inside a GGUF block
    end: int
    dtype: torch.dtype  # how the plane is viewed (float16 for scales, int32 for Q5_0's high bits)


U8, I8, F16 = torch.uint8, torch.int8, torch.float16
_K4 = (Field(0, 2, F16), Field(2, 4, F16), Field(4, 16, U8))  # Q4_K/Q5_K d, dmin, packed scales

# per format, its block's fields in the kernels' argument order
FIELDS: dict[GGMLQuantizationType, tuple[Field, ...]] = {
    Q.Q4_0: (Field(2, 18, U8), Field(0, 2, F16)),
    Q.Q4_1: (Field(4, 20, U8), Field(0, 2, F16), Field(2, 4, F16)),
    Q.Q5_0: (Field(6, 22, U8), Field(2, 6, torch.int32), Field(0, 2, F16)),
    Q.Q8_0: (Field(2, 34, I8), Field(0, 2, F16)),
    Q.Q4_K: (*_K4, Field(16, 144, U8)),
    Q.Q5_K: (*_K4, Field(16, 48, U8), Field(48, 176, U8)),
    Q.Q6_K: (Field(0, 128, U8), Field(128, 192, U8), Field(192, 208, I8), Field(208, 210, F16)),
    Q.IQ4_NL: (Field(2, 18, U8), Field(0, 2, F16)),
    Q.IQ4_XS: (Field(0, 2, F16), Field(2, 4, torch.int16), Field(4, 8, U8), Field(8, 136, U8)),
    Q.IQ3_S: (Field(0, 2, F16), Field(2, 66, U8), Field(66, 74, U8), Field(74, 106, U8), Field(106, 110, U8)),
    Q.IQ3_XXS: (Field(0, 2, F16), Field(2, 66, U8), Field(66, 98, torch.int32)),
    Q.IQ2_XXS: (Field(0, 2, F16), Field(2, 66, torch.int32)),  # per 32: grid-index word, sign/scale word
    Q.F32: (Field(0, 4, torch.float32),),
    Q.F16: (Field(0, 2, F16),),
    Q.BF16: (Field(0, 2, torch.bfloat16),),
}


@dataclass(frozen=True)
class TritonWeight:
    qtype: GGMLQuantizationType
    shape: tuple[int, int]  # (N, K)
    planes: tuple[torch.Tensor, ...]


def _ksigns(device: torch.device) -> torch.Tensor:
    """uint8 [128]: codebooks.signs' eight +-1 of each sign index as bits (set = negative)."""
    negative = (codebooks.signs() < 0).to(torch.int32)
    return (negative << torch.arange(8, dtype=torch.int32)).sum(-1).to(torch.uint8).to(device)


def _grid_words(qtype: GGMLQuantizationType, device: torch.device) -> torch.Tensor:
    """int32 [entries * width / 4]: the lattice points, 4 int8 values per little-endian word."""
    return codebooks.grid(qtype).contiguous().view(torch.int32).reshape(-1).to(device)


def tables(qtype: GGMLQuantizationType, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The value tables the format's kernels take after its planes (none for the other formats)."""
    if qtype in (Q.IQ4_NL, Q.IQ4_XS):
        return (codebooks.levels(qtype).to(torch.float32).to(device),)
    if qtype == Q.IQ3_S:
        return (_grid_words(qtype, device),)
    if qtype in (Q.IQ3_XXS, Q.IQ2_XXS):
        return (_grid_words(qtype, device), _ksigns(device))
    return ()


def split_fields(qtype: GGMLQuantizationType, raw: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """GGUF rows uint8 [N, row_bytes] -> one contiguous plane per block field, [N, n_blocks * field]
    viewed as the field's dtype, in the kernel's argument order (a byte permutation of `raw`)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, block_shape(qtype)[1])
    return tuple(
        blocks[..., f.start : f.end].reshape(rows, -1).contiguous().view(f.dtype) for f in FIELDS[qtype]
    )


def join_fields(qtype: GGMLQuantizationType, planes: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Inverse of split_fields: the GGUF rows, each block's fields put back at their byte ranges."""
    rows, fields = planes[0].shape[0], FIELDS[qtype]
    pieces = [
        p.view(torch.uint8).reshape(rows, -1, f.end - f.start)
        for p, f in zip(planes[: len(fields)], fields, strict=True)  # the tables after them are no field
    ]
    order = sorted(range(len(fields)), key=lambda i: fields[i].start)
    return torch.cat([pieces[i] for i in order], dim=-1).reshape(rows, -1)


def default_device() -> torch.device:
    """The current GPU; the CPU when none is visible or under the Triton interpreter (it runs on CPU
    tensors)."""
    if torch.cuda.is_available() and not triton.knobs.runtime.interpret:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def weight_planes(qtype: GGMLQuantizationType, raw: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What the kernels take of GGUF rows `raw`: their field planes, then the format's tables."""
    return split_fields(qtype, raw) + tables(qtype, raw.device)


def upload(info: TensorInfo, device: torch.device | None = None) -> TritonWeight:
    """Upload the raw GGUF rows once, then split them into field planes on the device."""
    raw = raw_rows(info).to(device or default_device())
    return TritonWeight(info.qtype, (raw.shape[0], info.shape[-1]), weight_planes(info.qtype, raw))

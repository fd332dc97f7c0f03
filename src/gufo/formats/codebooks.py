"""The value tables of the codebook formats, taken from the `gguf` package (never retyped here).

The IQ2/IQ3/IQ1 lattices are gguf-py's `grid` tables (decoded from its `grid_hex` by its own
`init_grid`), the IQ2/IQ3 sign patterns its `ksigns`, and the IQ4 and MXFP4 levels its `kvalues`. All
are small integers, so they are held as int8; every entry is checked to be integral on the way in.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

Q = GGMLQuantizationType
CPU = torch.device("cpu")


def _integral(values: np.ndarray, what: str) -> torch.Tensor:
    as_int = values.astype(np.int8)
    if not np.array_equal(as_int.astype(values.dtype), values):
        raise RuntimeError(f"gguf's {what} is not a table of 8-bit integers")
    return torch.from_numpy(as_int)


@functools.cache
def _grid_cpu(qtype: GGMLQuantizationType) -> torch.Tensor:
    cls = gguf_quants.IQ1_S if qtype == Q.IQ1_M else getattr(gguf_quants, qtype.name)
    cls.init_grid()  # gguf-py decodes `grid_hex` on first use; this is that decoder
    return _integral(np.asarray(cls.grid).reshape(cls.grid_shape), f"{qtype.name} grid")


@functools.cache
def grid(qtype: GGMLQuantizationType, device: torch.device = CPU) -> torch.Tensor:
    """int8 [entries, width]: the lattice points of an IQ format (IQ1_M shares IQ1_S's)."""
    return _grid_cpu(qtype).to(device)


@functools.cache
def signs(device: torch.device = CPU) -> torch.Tensor:
    """int8 [128, 8] of +-1: the eight signs of each 7-bit sign index of IQ2_XXS/IQ2_XS/IQ3_XXS (the
    eighth sign makes the count of minus signs even; gguf's `ksigns` holds it in each byte's top bit)."""
    ksigns = np.frombuffer(gguf_quants.IQ2_XXS.ksigns, dtype=np.uint8)
    bits = (ksigns[:, None] >> np.arange(8, dtype=np.uint8)) & 1
    return torch.from_numpy(1 - 2 * bits.astype(np.int8)).to(device)


@functools.cache
def levels(qtype: GGMLQuantizationType, device: torch.device = CPU) -> torch.Tensor:
    """int8 [16]: the values of a 4-bit code: IQ4_NL/IQ4_XS's non-linear levels, MXFP4's e2m1 values
    doubled (its e8m0 scale is halved to match)."""
    source = gguf_quants.MXFP4 if qtype == Q.MXFP4 else gguf_quants.IQ4_NL
    return _integral(np.array(source.kvalues, dtype=np.int16), f"{qtype.name} kvalues").to(device)

"""AMDGPU kernel descriptor (the 64-byte `K.kd` object): the fields a resource check needs.

Layout and bits: shared/docs/kernel-resources-facts.md, section 4 (AMDGPUUsage "Kernel Descriptor").
Register counts decoded here are allocation upper bounds; prefer the metadata note's exact counts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gufo.tools.kernel_check.model import FormatError

KD_SIZE = 64


@dataclass(frozen=True)
class KernelDescriptor:
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    code_properties: int

    @property
    def wave32(self) -> bool:
        return bool(self.code_properties & (1 << 10))

    @property
    def uses_dynamic_stack(self) -> bool:
        return bool(self.code_properties & (1 << 11))

    @property
    def private_segment_enabled(self) -> bool:
        return bool(self.rsrc2 & 1)

    @property
    def wgp_mode(self) -> bool:
        return bool(self.rsrc1 & (1 << 29))

    def vgprs(self, arch: str) -> int:
        """VGPRs allocated (upper bound; unified VGPR+AGPR on gfx90a/gfx94x/gfx950)."""
        blocks = self.rsrc1 & 0x3F
        return (blocks + 1) * vgpr_encoding_granule(arch, 32 if self.wave32 else 64)

    def sgprs(self, arch: str) -> int | None:
        """SGPRs allocated on gfx6-gfx9; None on gfx10+ (the field is reserved there)."""
        if _gfx_major(arch) >= 10:
            return None
        return (((self.rsrc1 >> 6) & 0xF) + 1) * 8

    def accum_offset(self) -> int:
        """gfx90a+: index of the first AGPR in the unified register file."""
        return ((self.rsrc3 & 0x3F) + 1) * 4


def parse_kernel_descriptor(data: bytes) -> KernelDescriptor:
    if len(data) < KD_SIZE:
        raise FormatError(f"kernel descriptor is {len(data)} bytes, expected {KD_SIZE}")
    group, private, kernarg = struct.unpack_from("<III", data, 0)
    rsrc3, rsrc1, rsrc2, props = struct.unpack_from("<IIIH", data, 44)
    return KernelDescriptor(group, private, kernarg, rsrc1, rsrc2, rsrc3, props)


def vgpr_encoding_granule(arch: str, wave: int) -> int:
    if arch in ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950", "gfx9-4-generic"):
        return 8
    if _gfx_major(arch) >= 10:
        return 8 if wave == 32 else 4
    return 4


def _gfx_major(arch: str) -> int:
    """gfx1151 -> 11, gfx942 -> 9, gfx11-generic -> 11."""
    digits = arch[3:]
    if "-" in digits:
        digits = digits.split("-")[0]
        return int(digits) if digits.isdigit() else 0
    head = digits[:2] if len(digits) >= 4 else digits[:1]
    return int(head) if head.isdigit() else 0

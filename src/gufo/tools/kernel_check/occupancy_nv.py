"""NVIDIA occupancy in resident warps per SM, the rules of NVIDIA's cuda_occupancy.h.

See shared/docs/kernel-resources-facts.md, section 5.2. The shared size is the kernel's static shared
memory without the 1 KiB per-block reservation (the calculator adds that itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class NvTarget:
    max_warps: int  # resident warps per SM
    max_blocks: int  # resident blocks per SM
    smem_per_sm: int  # bytes, with the default (full) carveout
    smem_per_block_optin: int  # largest static + dynamic shared a block may use


TARGETS: dict[str, NvTarget] = {
    "sm_80": NvTarget(64, 32, 167936, 166912),
    "sm_86": NvTarget(48, 16, 102400, 101376),
    "sm_89": NvTarget(48, 24, 102400, 101376),
    "sm_90": NvTarget(64, 32, 233472, 232448),
    "sm_90a": NvTarget(64, 32, 233472, 232448),
}
REGS_PER_SM = 65536
SUB_PARTITIONS = 4
REG_GRANULE = 256  # registers are allocated per warp in units of 256
SMEM_GRANULE = 128
SMEM_RESERVED = 1024  # per block, by the driver
MAX_REGS_PER_THREAD = 255


@dataclass(frozen=True)
class NvOccupancy:
    warps_per_sm: int
    blocks_per_sm: int
    limited_by: str  # "registers", "shared_memory", "warps", "blocks", "block_size" or "max_warps"


def nv_occupancy(
    arch: str, registers: int, shared_static: int, block_size: int, max_threads: int | None = None
) -> NvOccupancy | None:
    """Resident warps per SM at `block_size`; 0 when such a block cannot launch. None: unknown arch."""
    t = TARGETS.get(arch)
    if t is None:
        return None
    if block_size < 1 or block_size > min(1024, max_threads or 1024):
        return NvOccupancy(0, 0, "block_size")
    warps = ceil(block_size / 32)
    per_warp = _round_up(registers * 32, REG_GRANULE)
    smem = _round_up(shared_static + SMEM_RESERVED, SMEM_GRANULE)
    if registers > MAX_REGS_PER_THREAD or per_warp * _round_up(warps, SUB_PARTITIONS) > REGS_PER_SM:
        return NvOccupancy(0, 0, "registers")
    if shared_static > t.smem_per_block_optin:
        return NvOccupancy(0, 0, "shared_memory")
    limits = {
        "registers": (REGS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS // warps
        if per_warp
        else 1 << 30,
        "shared_memory": t.smem_per_sm // smem,
        "warps": t.max_warps // warps,
        "blocks": t.max_blocks,
    }
    blocks = min(limits.values())
    limited_by = min(limits, key=lambda k: limits[k])
    if blocks * warps == t.max_warps:
        limited_by = "max_warps"
    return NvOccupancy(blocks * warps, blocks, limited_by)


def _round_up(n: int, g: int) -> int:
    return (n + g - 1) // g * g

"""AMD occupancy in waves per SIMD, LLVM's model (what -Rpass-analysis=kernel-resource-usage prints).

Constants and formulas: shared/docs/kernel-resources-facts.md, section 5.1 (AMDGPUBaseInfo.cpp,
AMDGPUSubtarget.cpp of LLVM 19 and 22). Scratch, dynamic LDS and the LDS allocation granule are ignored,
as LLVM ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class AmdTarget:
    total_vgprs_w32: int  # VGPRs per SIMD lane in wave32 (wave64: half); gfx9: the wave64 count
    granule_w32: int  # VGPR allocation granule in wave32 (wave64: half); gfx9: the wave64 granule
    max_waves: int  # waves per SIMD
    lds_per_cu: int  # bytes the formula divides (WGP mode doubles gfx10+'s 64 KiB)
    gfx10_plus: bool  # SGPRs never limit; wave32 possible; 32 barriers per WGP


_GFX11_15X = AmdTarget(1536, 24, 16, 131072, True)  # Feature1_5xVGPRs
_GFX103 = AmdTarget(1024, 16, 16, 131072, True)
_GFX101 = AmdTarget(1024, 8, 20, 131072, True)
_GFX90A = AmdTarget(512, 8, 8, 65536, False)

TARGETS: dict[str, AmdTarget] = {
    "gfx1100": _GFX11_15X,
    "gfx1101": _GFX11_15X,
    "gfx1151": _GFX11_15X,
    "gfx1200": _GFX11_15X,  # LLVM 22 gives gfx12 the 1.5x file too (checked against its remarks)
    "gfx1201": _GFX11_15X,
    "gfx1102": _GFX103,
    "gfx1103": _GFX103,
    "gfx1150": _GFX103,
    "gfx1152": _GFX103,
    "gfx1153": _GFX103,
    "gfx11-generic": _GFX103,
    "gfx1030": _GFX103,
    "gfx1031": _GFX103,
    "gfx1032": _GFX103,
    "gfx1033": _GFX103,
    "gfx1034": _GFX103,
    "gfx1035": _GFX103,
    "gfx1036": _GFX103,
    "gfx10-3-generic": _GFX103,
    "gfx1010": _GFX101,
    "gfx1011": _GFX101,
    "gfx1012": _GFX101,
    "gfx1013": _GFX101,
    "gfx90a": _GFX90A,
    "gfx940": _GFX90A,
    "gfx941": _GFX90A,
    "gfx942": _GFX90A,
    "gfx9-4-generic": _GFX90A,
    "gfx950": AmdTarget(512, 8, 8, 163840, False),
    "gfx900": AmdTarget(256, 4, 10, 65536, False),
    "gfx906": AmdTarget(256, 4, 10, 65536, False),
    "gfx908": AmdTarget(256, 4, 10, 65536, False),
}
EUS_PER_CU = 4  # SIMDs per CU (per WGP in WGP mode, which LLVM assumes)


@dataclass(frozen=True)
class AmdOccupancy:
    waves_per_simd: int
    limited_by: str  # "vgpr", "sgpr", "lds", "workgroup_size" or "max_waves"


def _align(n: int, g: int) -> int:
    return (n + g - 1) // g * g


def _vgpr_limit(t: AmdTarget, wave: int, vgprs: int) -> int:
    total, granule = t.total_vgprs_w32, t.granule_w32
    if t.gfx10_plus and wave == 64:
        total, granule = total // 2, granule // 2
    if vgprs < granule:
        return t.max_waves
    return min(max(total // _align(vgprs, granule), 1), t.max_waves)


def _sgpr_limit(t: AmdTarget, sgprs: int) -> int:
    if t.gfx10_plus:
        return t.max_waves
    waves = 10 if sgprs <= 80 else 9 if sgprs <= 88 else 8 if sgprs <= 100 else 7
    return min(waves, t.max_waves)


def _max_wgs_per_cu(t: AmdTarget, wave: int, size: int) -> int:
    waves = ceil(size / wave)
    slots = t.max_waves * EUS_PER_CU
    if waves == 1:
        return slots
    return min(slots // waves, 32 if t.gfx10_plus else 16)


def _lds_limit(t: AmdTarget, wave: int, lds: int, wg: int, llvm: int) -> int:
    groups_by_lds = t.lds_per_cu // max(lds, 1)
    if groups_by_lds == 0:
        return 1
    if llvm < 20:  # LLVM 19: whole groups of the maximum size only
        groups = min(_max_wgs_per_cu(t, wave, wg), groups_by_lds)
        return min(ceil(groups * ceil(wg / wave) / EUS_PER_CU), t.max_waves)
    # LLVM 22: smaller groups may fill the wave slots a maximum-size group leaves over
    min_wpg = ceil(1 / wave)
    max_wgs = min(_max_wgs_per_cu(t, wave, 1), groups_by_lds)
    max_wpc = min_wpg * max_wgs
    max_wpg = ceil(wg / wave)
    min_wgs = min(_max_wgs_per_cu(t, wave, wg), groups_by_lds)
    min_wpc = max_wpg * min_wgs
    if min_wpc >= max_wpc:
        max_wpc = min_wpc
    else:
        leftover = t.max_waves * EUS_PER_CU - max_wgs * min_wpg
        if leftover // max_wgs:
            max_wpc += max_wgs * min(leftover // max_wgs, max_wpg - min_wpg)
    return max(1, min(ceil(max_wpc / EUS_PER_CU), t.max_waves))


def amd_occupancy(
    arch: str, wave: int, vgprs: int, sgprs: int, lds: int, max_wg: int, llvm_major: int = 22
) -> AmdOccupancy | None:
    """Waves per SIMD for a kernel; `vgprs` is .vgpr_count (unified VGPR+AGPR on gfx90a/gfx942).

    `llvm_major` picks the LDS/work-group formula of the compiler that built the kernel (19 or 22).
    Returns None for a target without a table.
    """
    t = TARGETS.get(arch)
    if t is None:
        return None
    wg = max(max_wg, 1)
    limits = {
        "vgpr": _vgpr_limit(t, wave, vgprs),
        "sgpr": _sgpr_limit(t, sgprs),
        "lds": _lds_limit(t, wave, lds, wg, llvm_major),
    }
    if limits["lds"] < t.max_waves and _lds_limit(t, wave, 0, wg, llvm_major) == limits["lds"]:
        limits = {"workgroup_size" if k == "lds" else k: v for k, v in limits.items()}
    waves = min(t.max_waves, *limits.values())
    if waves == t.max_waves:
        return AmdOccupancy(waves, "max_waves")
    return AmdOccupancy(waves, min(limits, key=lambda k: limits[k]))

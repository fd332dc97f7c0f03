"""AMDGPU code objects (code object v4/v5/v6): kernels from the `amdhsa.kernels` metadata note,
cross-checked against each kernel descriptor (`K.kd`). Facts: kernel-resources-facts.md sections 1, 2, 4."""

from __future__ import annotations

import re

import msgpack
from elftools.elf.elffile import ELFFile

from gufo.tools.kernel_check.elfutil import EM_AMDGPU, compiler_version, open_elf
from gufo.tools.kernel_check.kd import KD_SIZE, KernelDescriptor, parse_kernel_descriptor
from gufo.tools.kernel_check.model import FormatError, Kernel
from gufo.tools.kernel_check.occupancy_amd import amd_occupancy

NT_AMDGPU_METADATA = 32
# the processor and features at the end of amdhsa.target ("amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";
# Triton's LLVM writes "amdgpu11.51-amd-amdhsa-unknown-gfx1151")
_TARGET_ID = re.compile(r"gfx[0-9a-f]+(?:-\d+)*(?:-generic)?(?::[a-z0-9_-]+[+-])*$")
# EF_AMDGPU_MACH (e_flags & 0xff) for targets whose note may be missing (AMDGPUUsage).
MACH = {
    0x2C: "gfx900", 0x2F: "gfx906", 0x30: "gfx908", 0x33: "gfx1010", 0x34: "gfx1011", 0x35: "gfx1012",
    0x36: "gfx1030", 0x37: "gfx1031", 0x38: "gfx1032", 0x3F: "gfx90a", 0x40: "gfx940", 0x41: "gfx1100",
    0x43: "gfx1150", 0x44: "gfx1103", 0x46: "gfx1101", 0x47: "gfx1102", 0x48: "gfx1200", 0x4A: "gfx1151",
    0x4B: "gfx941", 0x4C: "gfx942", 0x4E: "gfx1201", 0x4F: "gfx950", 0x54: "gfx11-generic",
}  # fmt: skip


def is_amdgpu(elf: ELFFile) -> bool:
    return elf["e_machine"] in ("EM_AMDGPU", EM_AMDGPU)


def read_code_object(data: bytes, container: str = "") -> list[Kernel]:
    elf = open_elf(data)
    if not is_amdgpu(elf):
        raise FormatError("not an AMDGPU code object")
    if elf.elfclass != 64 or not elf.little_endian:
        raise FormatError("AMDGPU code object is not ELF64 little endian")
    mach_arch = MACH.get(elf["e_flags"] & 0xFF, f"gfx?(mach 0x{elf['e_flags'] & 0xFF:x})")
    meta = _metadata(elf)
    m = _TARGET_ID.search(str(meta.get("amdhsa.target", ""))) if meta else None
    target_id = m[0] if m else ""
    arch = target_id.split(":")[0] or mach_arch
    compiler, llvm = compiler_version(elf)
    symbols = _symbols(elf)
    kernels: list[Kernel] = []
    if meta is not None:
        entries = meta.get("amdhsa.kernels") or []
        if not isinstance(entries, list):
            raise FormatError("amdhsa.kernels is not a list")
        for entry in entries:
            if not isinstance(entry, dict):
                raise FormatError("amdhsa.kernels entry is not a map")
            kernels.append(_from_metadata(entry, arch, elf, data, symbols, llvm))
    else:
        kernels = [_from_descriptor(name[:-3], arch, data, sym, llvm)
                   for name, sym in symbols.items() if name.endswith(".kd")]  # fmt: skip
    for k in kernels:
        k.container = container
        k.compiler = compiler
        k.target_id = target_id if target_id != arch else ""
    return kernels


def _metadata(elf: ELFFile) -> dict | None:
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        for note in sec.iter_notes():
            if note["n_name"] == "AMDGPU" and note["n_type"] == NT_AMDGPU_METADATA:
                desc = note["n_desc"]
                if isinstance(desc, str):
                    desc = desc.encode("latin-1")
                try:
                    meta = msgpack.unpackb(bytes(desc), raw=False, strict_map_key=False)
                except (ValueError, TypeError, msgpack.UnpackException) as err:
                    raise FormatError(f"bad AMDGPU metadata note: {err}") from None
                if not isinstance(meta, dict):
                    raise FormatError("AMDGPU metadata note is not a map")
                return meta
    return None


def _symbols(elf: ELFFile) -> dict[str, tuple[int, int, int]]:
    """name -> (file offset or -1, size, value) from .dynsym and .symtab.

    In a loaded image the address decides the section (tools that drop sections do not always fix
    .dynsym's section indices); in a relocatable object the section index does.
    """
    loaded = elf["e_type"] in ("ET_DYN", "ET_EXEC")
    spans = [(s["sh_addr"], s["sh_addr"] + s["sh_size"], s["sh_offset"]) for s in elf.iter_sections()
             if s["sh_flags"] & 2 and s["sh_type"] != "SHT_NOBITS"]  # fmt: skip
    out: dict[str, tuple[int, int, int]] = {}
    for table in (".dynsym", ".symtab"):
        sec = elf.get_section_by_name(table)
        if sec is None or not hasattr(sec, "iter_symbols"):
            continue
        for sym in sec.iter_symbols():
            shndx, value, offset = sym["st_shndx"], sym["st_value"], -1
            if shndx == "SHN_ABS" or not isinstance(shndx, int) or shndx == 0:
                pass
            elif loaded:
                offset = next((off + value - lo for lo, hi, off in spans if lo <= value < hi), -1)
            elif shndx < elf.num_sections():
                host = elf.get_section(shndx)
                offset = -1 if host["sh_type"] == "SHT_NOBITS" else host["sh_offset"] + value
            out[sym.name] = (offset, sym["st_size"], value)
    return out


def _descriptor(data: bytes, sym: tuple[int, int, int] | None) -> KernelDescriptor | None:
    if sym is None or sym[0] < 0 or sym[0] + KD_SIZE > len(data):
        return None
    return parse_kernel_descriptor(data[sym[0] : sym[0] + KD_SIZE])


def _int(entry: dict, key: str, default: int | None = 0) -> int | None:
    value = entry.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FormatError(f"metadata field {key} is not an integer")
    return value


def _from_metadata(entry: dict, arch: str, elf, data: bytes, symbols: dict, llvm: int) -> Kernel:
    name = entry.get(".name")
    if not isinstance(name, str):
        raise FormatError("kernel without .name in the metadata note")
    unified = _int(entry, ".vgpr_count")
    agpr = _int(entry, ".agpr_count")
    vgpr = unified
    if agpr:  # gfx90a+: .vgpr_count is alignTo(arch VGPRs, 4) + AGPRs
        exact = symbols.get(f"{name}.num_vgpr")  # clang 20+ records the exact count as a symbol
        vgpr = exact[2] if exact and 0 <= exact[2] <= unified - agpr else unified - agpr
    values = {
        "vgpr": vgpr,
        "agpr": agpr,
        "sgpr": _int(entry, ".sgpr_count"),
        "scratch_bytes": _int(entry, ".private_segment_fixed_size"),
        "vgpr_spill": _int(entry, ".vgpr_spill_count"),
        "sgpr_spill": _int(entry, ".sgpr_spill_count"),
        "lds_bytes": _int(entry, ".group_segment_fixed_size"),
        "wavefront_size": _int(entry, ".wavefront_size", 64),
        "max_flat_workgroup_size": _int(entry, ".max_flat_workgroup_size", 1024),
        "occupancy_waves_per_simd": None,
    }
    kernel = Kernel("amd", arch, name, values)
    if entry.get(".uses_dynamic_stack"):
        kernel.notes.append("uses a dynamic stack: scratch is a lower bound")
    symbol = entry.get(".symbol", f"{name}.kd")
    kd = _descriptor(data, symbols.get(symbol)) if isinstance(symbol, str) else None
    if kd is None:
        kernel.notes.append("no kernel descriptor found to cross-check")
    else:
        kernel.notes.extend(_cross_check(kd, values, arch))
    kernel.compiler_major = llvm
    set_occupancy(kernel)
    return kernel


def _cross_check(kd: KernelDescriptor, v: dict, arch: str) -> list[str]:
    problems = []
    if kd.group_segment_fixed_size != v["lds_bytes"]:
        problems.append(f"descriptor LDS {kd.group_segment_fixed_size} != metadata {v['lds_bytes']}")
    if kd.private_segment_fixed_size != v["scratch_bytes"]:
        problems.append(
            f"descriptor scratch {kd.private_segment_fixed_size} != metadata {v['scratch_bytes']}"
        )
    if arch.startswith("gfx1") and (32 if kd.wave32 else 64) != v["wavefront_size"]:
        problems.append(f"descriptor wave size != metadata {v['wavefront_size']}")
    used = (v["vgpr"] or 0) + (v["agpr"] or 0)
    if kd.vgprs(arch) < used:  # clang 22 may inflate the blocks, never shrink them
        problems.append(f"descriptor allocates {kd.vgprs(arch)} VGPRs, metadata uses {used}")
    return problems


def _from_descriptor(name: str, arch: str, data: bytes, sym: tuple[int, int, int], llvm: int) -> Kernel:
    kd = _descriptor(data, sym)
    if kd is None:
        raise FormatError(f"kernel descriptor {name}.kd lies outside the file")
    wave = 32 if kd.wave32 else 64
    values = {
        "vgpr": kd.vgprs(arch),
        "agpr": None,
        "sgpr": kd.sgprs(arch),
        "scratch_bytes": kd.private_segment_fixed_size,
        "vgpr_spill": None,
        "sgpr_spill": None,
        "lds_bytes": kd.group_segment_fixed_size,
        "wavefront_size": wave,
        "max_flat_workgroup_size": None,
        "occupancy_waves_per_simd": None,
    }
    kernel = Kernel("amd", arch, name, values)
    kernel.notes.append("no metadata note: register counts are the descriptor's allocation (upper bounds)")
    return kernel


def set_occupancy(kernel: Kernel, dynamic_lds: int = 0) -> None:
    """LLVM's occupancy for the kernel's resources (plus LDS allocated at launch, e.g. by Triton)."""
    v = kernel.values
    vgpr, agpr = v["vgpr"] or 0, v["agpr"] or 0
    unified = (vgpr + 3) // 4 * 4 + agpr if agpr else vgpr  # what .vgpr_count holds on gfx90a+
    occ = amd_occupancy(
        kernel.arch,
        v["wavefront_size"] or 64,
        unified,
        v["sgpr"] or 0,
        (v["lds_bytes"] or 0) + dynamic_lds,
        v["max_flat_workgroup_size"] or 1024,
        kernel.compiler_major or 22,
    )
    if occ is not None:
        v["occupancy_waves_per_simd"] = occ.waves_per_simd
        kernel.occupancy_limited_by = occ.limited_by
    else:
        kernel.occupancy_limited_by = "unknown target"

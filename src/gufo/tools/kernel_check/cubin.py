"""NVIDIA cubins: per-kernel registers, stack frame, shared memory and launch bounds from `.nv.info`.
Facts: kernel-resources-facts.md sections 3.4, 5.2 and 6."""

from __future__ import annotations

from gufo.tools.kernel_check import nvinfo
from gufo.tools.kernel_check.elfutil import EM_CUDA, open_elf, section_bytes
from gufo.tools.kernel_check.model import FormatError, Kernel
from gufo.tools.kernel_check.occupancy_nv import nv_occupancy

DEFAULT_BLOCK = 256
SM90_RESERVED_SMEM = 1024


def is_cubin(elf) -> bool:
    return elf["e_machine"] in ("EM_CUDA", EM_CUDA)


def sm_arch(e_flags: int) -> str:
    """SM from e_flags: bits 16..23 on older toolkits, else bits 8..15 (CUDA 12+)."""
    sm = (e_flags >> 16) & 0xFF or (e_flags >> 8) & 0xFF
    return f"sm_{sm}"


def read_cubin(data: bytes, container: str = "", block_size: int | None = None) -> list[Kernel]:
    elf = open_elf(data)
    if not is_cubin(elf):
        raise FormatError("not an NVIDIA cubin")
    arch = sm_arch(elf["e_flags"])
    symtab = elf.get_section_by_name(".symtab")
    if symtab is None or not hasattr(symtab, "iter_symbols"):
        raise FormatError("cubin without .symtab")
    symbols = list(symtab.iter_symbols())
    global_info = nvinfo.per_function(section_bytes(elf, ".nv.info") or b"")
    reserved = elf.get_section_by_name(".nv.shared.reserved.0") is not None
    kernels = []
    for index, sym in enumerate(symbols):
        if sym["st_info"]["type"] != "STT_FUNC" or sym["st_info"]["bind"] == "STB_LOCAL":
            continue
        info = section_bytes(elf, f".nv.info.{sym.name}")
        if info is None:
            continue
        attrs = nvinfo.kernel_attrs(info)
        per_fn = global_info.get(index, {})
        shared_sec = elf.get_section_by_name(f".nv.shared.{sym.name}")
        shared = shared_sec["sh_size"] if shared_sec is not None else 0
        if reserved:  # sm_90 cubins count the driver's 1 KiB in each kernel's shared section
            shared = max(0, shared - SM90_RESERVED_SMEM)
        local_sec = elf.get_section_by_name(f".nv.local.{sym.name}")
        bound = nvinfo.max_threads(attrs)
        kernel = Kernel("nvidia", arch, sym.name, {
            "registers": per_fn.get(nvinfo.EIATTR_REGCOUNT),
            "stack_frame_bytes": per_fn.get(nvinfo.EIATTR_FRAME_SIZE, 0),
            "shared_bytes_static": shared,
            "local_bytes": local_sec["sh_size"] if local_sec is not None else 0,
            "max_threads_per_block": bound,
            "occupancy_warps_per_sm": None,
        }, container=container)  # fmt: skip
        if kernel.values["registers"] is None:
            kernel.notes.append("no EIATTR_REGCOUNT record")
        set_occupancy(kernel, block_size)
        kernels.append(kernel)
    return kernels


def set_occupancy(kernel: Kernel, block_size: int | None, dynamic_shared: int = 0) -> None:
    v = kernel.values
    block = block_size or v["max_threads_per_block"] or DEFAULT_BLOCK
    kernel.block_size = block
    occ = nv_occupancy(
        kernel.arch, v["registers"] or 0, (v["shared_bytes_static"] or 0) + dynamic_shared, block,
        v["max_threads_per_block"],
    )  # fmt: skip
    if occ is None:
        kernel.occupancy_limited_by = "unknown target"
        return
    v["occupancy_warps_per_sm"] = occ.warps_per_sm
    kernel.occupancy_limited_by = occ.limited_by

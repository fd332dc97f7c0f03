"""Find the GPU kernels in a file or directory: recognise the container, unwrap it, read each image."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError

from gufo.errors import BadInputError
from gufo.tools.kernel_check import amdgpu, bundle, ccob, cubin, fatbin, pe, triton
from gufo.tools.kernel_check.demangle import demangle_all
from gufo.tools.kernel_check.elfutil import open_elf, section_bytes
from gufo.tools.kernel_check.model import FormatError, Kernel

MAX_DEPTH = 6
MAX_FILE = 1 << 31
HIP_SECTIONS = (".hip_fatbin", ".hip_fat")
NV_SECTIONS = (".nv_fatbin", ".nv_fatb")


@dataclass
class Context:
    block_size: int | None = None  # NVIDIA occupancy block size; None: launch bound, else 256
    warnings: list[str] = field(default_factory=list)


def read_paths(paths: list[str], block_size: int | None = None) -> tuple[list[Kernel], list[str]]:
    """All kernels of all paths, and warnings (skipped entries, cross-check mismatches)."""
    kernels: list[Kernel] = []
    warnings: list[str] = []
    for path in paths:
        found, notes = read_path(path, block_size)
        kernels.extend(found)
        warnings.extend(notes)
    return kernels, warnings


def read_path(path: str | os.PathLike, block_size: int | None = None) -> tuple[list[Kernel], list[str]]:
    """Kernels in one file (or Triton cache directory); BadInputError naming the file on bad input."""
    p = Path(path)
    ctx = Context(block_size)
    try:
        if p.is_dir():
            kernels = triton.read_dir(p, lambda data, where: read_blob(data, where, ctx, 0), block_size)
        else:
            if p.stat().st_size > MAX_FILE:
                raise FormatError("file larger than 2 GiB")
            kernels = read_blob(p.read_bytes(), [], ctx, 0)
    except FormatError as err:
        raise BadInputError(f"{path}: {_one_line(str(err))}") from None
    except ELFError as err:
        raise BadInputError(f"{path}: malformed ELF: {_one_line(str(err))}") from None
    except OSError as err:
        raise BadInputError(f"{path}: cannot read: {err.strerror or err}") from None
    except Exception as err:  # a reader tripped over malformed data: still one line, no traceback
        raise BadInputError(
            f"{path}: malformed input ({type(err).__name__}: {_one_line(str(err))})"
        ) from None
    if not kernels:
        extra = f" ({'; '.join(ctx.warnings)})" if ctx.warnings else ""
        raise BadInputError(f"{path}: no kernels found{extra}")
    names = demangle_all([k.name for k in kernels])
    warnings = [f"{path}: {w}" for w in ctx.warnings]
    for k in kernels:
        k.file = str(path)
        k.display_name = names.get(k.name, k.name)
        warnings.extend(f"{path}: {k.arch} {k.display_name}: {note}" for note in k.notes)
    return kernels, warnings


def _one_line(text: str, limit: int = 240) -> str:
    """Messages may quote bytes from the file: keep them printable and short."""
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_blob(data: bytes, where: list[str], ctx: Context, depth: int) -> list[Kernel]:
    """Kernels in `data`, whose place in the file is described by `where` (outermost first)."""
    if depth > MAX_DEPTH:
        raise FormatError("containers nested too deeply")
    if not data:
        raise FormatError("zero-length payload" if where else "empty file")
    if data.startswith(b"\x7fELF"):
        return _read_elf(data, where, ctx, depth)
    if data.startswith(bundle.BUNDLE_MAGIC):
        return _read_bundle(data, where, ctx, depth)
    if data.startswith(ccob.CCOB_MAGIC):
        raw, _, what = ccob.parse_ccob(data)
        return _read_bundle(raw, [*where, what], ctx, depth)
    if fatbin.is_fatbin(data):
        return _read_fatbin(data, where, ctx, depth)
    if pe.is_pe(data) or pe.is_coff_object(data):
        return _read_sections(pe.sections(data), where, ctx, depth, "PE/COFF")
    raise FormatError("not an ELF, PE, offload bundle, compressed bundle or fatbin file")


def _label(where: list[str], default: str) -> str:
    return " / ".join(where) if where else default


def _read_elf(data: bytes, where: list[str], ctx: Context, depth: int) -> list[Kernel]:
    elf = open_elf(data)
    if amdgpu.is_amdgpu(elf):
        return amdgpu.read_code_object(data, _label(where, "code object"))
    if cubin.is_cubin(elf):
        return cubin.read_cubin(data, _label(where, "cubin"), ctx.block_size)
    found = {name: section_bytes(elf, name) for name in HIP_SECTIONS + NV_SECTIONS}
    return _read_sections({k: v for k, v in found.items() if v is not None}, where, ctx, depth, "ELF")


def _read_sections(sections: dict[str, bytes], where: list[str], ctx: Context, depth: int, kind: str) -> list:
    kernels: list[Kernel] = []
    seen = False
    for name, data in sections.items():
        if name in HIP_SECTIONS:
            seen = True
            kernels += _read_hip_fatbin(data, [*where, name], ctx, depth)
        elif name in NV_SECTIONS:
            seen = True
            kernels += _read_fatbin(data, [*where, name], ctx, depth)
    if not seen:
        raise FormatError(f"{kind} file holds no GPU code (no .hip_fatbin or .nv_fatbin section)")
    return kernels


def _read_hip_fatbin(data: bytes, where: list[str], ctx: Context, depth: int) -> list[Kernel]:
    """Bundles back to back in a host section; each starts 8-byte aligned after zero padding."""
    if not data:
        raise FormatError(f"{where[-1]} has a zero-length payload")
    kernels: list[Kernel] = []
    pos, index = 0, 0
    while pos < len(data):
        here = [*where[:-1], f"{where[-1]}[{index}]"]
        chunk = data[pos:]
        if chunk.startswith(bundle.BUNDLE_MAGIC):
            _, size = bundle.parse_bundle(chunk)
            kernels += _read_bundle(chunk[:size], here, ctx, depth)
        elif chunk.startswith(ccob.CCOB_MAGIC):
            raw, size, what = ccob.parse_ccob(chunk)
            kernels += _read_bundle(raw, [*here, what], ctx, depth)
        else:
            raise FormatError(f"{where[-1]} holds no offload bundle at offset {pos}")
        pos = (pos + size + 7) // 8 * 8
        while pos < len(data) and not any(data[pos : pos + 8]):
            pos += 8
        index += 1
    return kernels


def _read_bundle(data: bytes, where: list[str], ctx: Context, depth: int) -> list[Kernel]:
    entries, _ = bundle.parse_bundle(data)
    kernels: list[Kernel] = []
    for entry in entries:
        if entry.entry_id.startswith("host-"):
            continue
        if not entry.data:
            raise FormatError(f"bundle entry {entry.entry_id} has a zero-length payload")
        kernels += read_blob(entry.data, [*where, entry.entry_id], ctx, depth + 1)
    return kernels


def _read_fatbin(data: bytes, where: list[str], ctx: Context, depth: int) -> list[Kernel]:
    if not data:
        raise FormatError(f"{where[-1]} has a zero-length payload")
    kernels: list[Kernel] = []
    for i, entry in enumerate(fatbin.iter_entries(data)):
        if entry.problem:
            ctx.warnings.append(entry.problem)
        if entry.kind != fatbin.KIND_CUBIN or entry.data is None:
            continue
        label = [*where, f"fatbin[{i}] sm_{entry.sm}"]
        kernels += cubin.read_cubin(entry.data, _label(label, "fatbin"), ctx.block_size)
    return kernels

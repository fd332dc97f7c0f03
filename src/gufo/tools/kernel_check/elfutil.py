"""Small helpers over pyelftools shared by the ELF readers."""

from __future__ import annotations

import io
import re

from elftools.elf.elffile import ELFFile

from gufo.tools.kernel_check.model import FormatError

EM_AMDGPU = 224
EM_CUDA = 190


def open_elf(data: bytes) -> ELFFile:
    if data[:4] != b"\x7fELF":
        raise FormatError("not an ELF file")
    if len(data) < 64:
        raise FormatError("truncated ELF header")
    return ELFFile(io.BytesIO(data))


def section_bytes(elf: ELFFile, name: str) -> bytes | None:
    sec = elf.get_section_by_name(name)
    if sec is None or sec["sh_type"] == "SHT_NOBITS":
        return None
    return sec.data()


def compiler_version(elf: ELFFile) -> tuple[str, int]:
    """("clang 19.1.7", 19) from the .comment section; ("", 0) when it names no clang."""
    data = section_bytes(elf, ".comment") or b""
    m = re.search(rb"clang version (\d+)(\.[\d.]+)?", data)
    if not m:
        return "", 0
    return "clang " + (m[1] + (m[2] or b"")).decode(), int(m[1])

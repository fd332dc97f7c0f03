"""Sections of Windows PE images and COFF objects, for `.hip_fat`/`.hip_fatbin` and `.nv_fatb` payloads."""

from __future__ import annotations

import struct

from gufo.tools.kernel_check.model import FormatError

COFF_AMD64 = 0x8664


def is_pe(data: bytes) -> bool:
    return data[:2] == b"MZ"


def is_coff_object(data: bytes) -> bool:
    return len(data) >= 20 and struct.unpack_from("<H", data)[0] == COFF_AMD64


def sections(data: bytes) -> dict[str, bytes]:
    """Section name -> raw contents, for a PE image (MZ) or an AMD64 COFF object."""
    if is_pe(data):
        if len(data) < 0x40:
            raise FormatError("truncated PE (DOS header)")
        (lfanew,) = struct.unpack_from("<I", data, 0x3C)
        if lfanew + 24 > len(data) or data[lfanew : lfanew + 4] != b"PE\0\0":
            raise FormatError("not a PE image (no PE signature)")
        coff, image = lfanew + 4, True
    elif is_coff_object(data):
        coff, image = 0, False
    else:
        raise FormatError("not a PE image or COFF object")
    _machine, count, _time, symtab, nsyms, opt_size, _chars = struct.unpack_from("<HHIIIHH", data, coff)
    table = coff + 20 + opt_size
    if table + 40 * count > len(data):
        raise FormatError("truncated PE/COFF section table")
    strings = symtab + 18 * nsyms
    out: dict[str, bytes] = {}
    for i in range(count):
        raw_name, vsize, _vaddr, rsize, rptr = struct.unpack_from("<8sIIII", data, table + 40 * i)
        name = raw_name.rstrip(b"\0").decode("latin-1")
        if name.startswith("/") and name[1:].isdigit() and not image:
            start = strings + int(name[1:])
            name = data[start : data.find(b"\0", start)].decode("latin-1") if start < len(data) else name
        size = min(vsize, rsize) if image and vsize else rsize
        if rptr + size > len(data):
            raise FormatError(f"truncated PE/COFF section {name}")
        out[name] = data[rptr : rptr + size]
    return out

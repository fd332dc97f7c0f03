"""NVIDIA `.nv.info` / `.nv.info.K` EIATTR records. Facts: kernel-resources-facts.md section 6."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from gufo.tools.kernel_check.model import FormatError

EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_MAX_THREADS = 0x05
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_REGCOUNT = 0x2F


def iter_records(data: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(format, attribute, value): SVAL values are the payload bytes, the others a u16."""
    pos = 0
    while pos + 4 <= len(data):
        fmt, attr, value = struct.unpack_from("<BBH", data, pos)
        pos += 4
        if fmt == EIFMT_SVAL:
            if pos + value > len(data):
                raise FormatError(f"truncated .nv.info record 0x{attr:02x}")
            yield fmt, attr, data[pos : pos + value]
            pos += value
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            yield fmt, attr, value
        else:
            raise FormatError(f"bad .nv.info record format {fmt}")


def per_function(data: bytes) -> dict[int, dict[int, int]]:
    """Global .nv.info: symbol index -> {attribute: value} for the (symbol, u32) records."""
    out: dict[int, dict[int, int]] = {}
    for fmt, attr, value in iter_records(data):
        if fmt == EIFMT_SVAL and isinstance(value, bytes) and len(value) == 8:
            sym, val = struct.unpack("<II", value)
            out.setdefault(sym, {})[attr] = val
    return out


def kernel_attrs(data: bytes) -> dict[int, int | bytes]:
    """.nv.info.K: attribute -> value (the last record wins)."""
    return {attr: value for _, attr, value in iter_records(data)}


def max_threads(attrs: dict[int, int | bytes]) -> int | None:
    value = attrs.get(EIATTR_MAX_THREADS)
    if isinstance(value, bytes) and len(value) >= 12:
        x, y, z = struct.unpack_from("<III", value)
        return x * max(y, 1) * max(z, 1)
    return None

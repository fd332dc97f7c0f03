"""CUDA fatbin containers (magic 0xBA55ED50), alone or in a host `.nv_fatbin` section. Facts: section 3.5."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import zstandard

from gufo.tools.kernel_check.model import FormatError

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
MAX_UNCOMPRESSED = 1 << 30


@dataclass(frozen=True)
class FatbinEntry:
    kind: int
    sm: int
    data: bytes | None  # None when the payload could not be read (see `problem`)
    problem: str = ""


def is_fatbin(data: bytes) -> bool:
    return len(data) >= 4 and struct.unpack_from("<I", data)[0] == FATBIN_MAGIC


def iter_entries(data: bytes) -> Iterator[FatbinEntry]:
    """Every entry of the containers laid back to back (8-byte aligned) from the start of `data`."""
    pos = 0
    while pos + 16 <= len(data):
        magic, _version, header, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            if pos == 0:
                raise FormatError("not a CUDA fatbin")
            if any(data[pos:]):
                raise FormatError(f"garbage after fatbin container at offset {pos}")
            return
        start, end = pos + header, pos + header + size
        if header < 16 or end > len(data):
            raise FormatError(f"truncated fatbin container at offset {pos}")
        yield from _entries(data, start, end)
        pos = (end + 7) // 8 * 8
    if pos == 0:
        raise FormatError("truncated fatbin header")


def _entries(data: bytes, pos: int, end: int) -> Iterator[FatbinEntry]:
    while pos + 64 <= end:
        kind, _version, header, size = struct.unpack_from("<HHIQ", data, pos)
        if header < 64 or pos + header + size > end:
            raise FormatError(f"truncated fatbin entry at offset {pos}")
        (compressed_size,) = struct.unpack_from("<I", data, pos + 16)
        (sm,) = struct.unpack_from("<I", data, pos + 28)
        (flags,) = struct.unpack_from("<Q", data, pos + 40)
        (raw_size,) = struct.unpack_from("<Q", data, pos + 56) if header >= 64 else (0,)
        payload = data[pos + header : pos + header + size]
        pos += header + size
        if size == 0:
            raise FormatError(f"fatbin entry for sm_{sm} has a zero-length payload")
        if kind not in (KIND_PTX, KIND_CUBIN):
            continue
        if flags & FLAG_ZSTD:
            payload = _unzstd(payload[: compressed_size or size], raw_size, sm)
        elif flags & FLAG_LZ4:
            yield FatbinEntry(kind, sm, None, f"sm_{sm} entry is LZ4-compressed (not supported)")
            continue
        yield FatbinEntry(kind, sm, payload)
    if pos != end and any(data[pos:end]):
        raise FormatError("truncated fatbin entry header")


def _unzstd(payload: bytes, raw_size: int, sm: int) -> bytes:
    if not 0 < raw_size <= MAX_UNCOMPRESSED:
        raise FormatError(f"fatbin entry for sm_{sm}: bad uncompressed size {raw_size}")
    try:
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_size)
    except zstandard.ZstdError as err:
        raise FormatError(f"fatbin entry for sm_{sm}: corrupt zstd payload: {err}") from None

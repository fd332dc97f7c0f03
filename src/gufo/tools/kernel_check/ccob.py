"""Compressed offload bundles ("CCOB", versions 1-3, zlib or zstd). Facts: section 3.2."""

from __future__ import annotations

import struct
import zlib

import zstandard

from gufo.tools.kernel_check.model import FormatError

CCOB_MAGIC = b"CCOB"
METHODS = {0: "zlib", 1: "zstd"}
MAX_UNCOMPRESSED = 1 << 30  # refuse to inflate beyond 1 GiB


def parse_ccob(data: bytes) -> tuple[bytes, int, str]:
    """(uncompressed bundle, size of the CCOB in `data`, description such as "ccob-v3-zstd")."""
    if not data.startswith(CCOB_MAGIC):
        raise FormatError("not a compressed offload bundle")
    if len(data) < 8:
        raise FormatError("truncated CCOB header")
    version, method = struct.unpack_from("<HH", data, 4)
    if version == 1:
        header, total = 20, len(data)
        (raw_size,) = struct.unpack_from("<I", data, 8) if len(data) >= header else (0,)
    elif version == 2:
        header = 24
        total, raw_size = struct.unpack_from("<II", data, 8) if len(data) >= header else (0, 0)
    elif version == 3:
        header = 32
        total, raw_size = struct.unpack_from("<QQ", data, 8) if len(data) >= header else (0, 0)
    else:
        raise FormatError(f"bad CCOB header: unknown version {version}")
    if len(data) < header:
        raise FormatError(f"truncated CCOB header (version {version} needs {header} bytes)")
    if method not in METHODS:
        raise FormatError(f"unknown CCOB compression method {method} (0 = zlib, 1 = zstd)")
    if total < header or total > len(data):
        raise FormatError(f"bad CCOB header: total size {total}, file has {len(data)} bytes")
    if raw_size == 0 or total == header:
        raise FormatError("CCOB has a zero-length payload")
    if raw_size > MAX_UNCOMPRESSED:
        raise FormatError(f"CCOB claims {raw_size} uncompressed bytes")
    payload = data[header:total]
    raw = _inflate(payload, method, raw_size)
    if len(raw) != raw_size:
        raise FormatError(f"CCOB payload inflates to {len(raw)} bytes, header says {raw_size}")
    return raw, total, f"ccob-v{version}-{METHODS[method]}"


def _inflate(payload: bytes, method: int, limit: int) -> bytes:
    try:
        if method == 0:
            out = zlib.decompressobj().decompress(payload, limit)
        else:
            out = zstandard.ZstdDecompressor().decompress(payload, max_output_size=limit)
    except (zlib.error, zstandard.ZstdError) as err:
        raise FormatError(f"corrupt CCOB payload ({METHODS[method]}): {err}") from None
    return out

"""Clang offload bundles (`__CLANG_OFFLOAD_BUNDLE__`): entry IDs and the code objects they point at.
Facts: kernel-resources-facts.md section 3.1 (ClangOffloadBundler.rst)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from gufo.tools.kernel_check.model import FormatError

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
MAX_ENTRIES = 4096
MAX_ID = 1024


@dataclass(frozen=True)
class BundleEntry:
    entry_id: str  # e.g. hipv4-amdgcn-amd-amdhsa--gfx1151
    data: bytes


def parse_bundle(data: bytes) -> tuple[list[BundleEntry], int]:
    """The entries of the bundle at the start of `data`, and the bundle's size in bytes."""
    if not data.startswith(BUNDLE_MAGIC):
        raise FormatError("not a clang offload bundle")
    if len(data) < 32:
        raise FormatError("truncated offload bundle header")
    (count,) = struct.unpack_from("<Q", data, 24)
    if count > MAX_ENTRIES:
        raise FormatError(f"offload bundle claims {count} entries")
    pos, end, entries = 32, 32, []
    for i in range(count):
        if pos + 24 > len(data):
            raise FormatError(f"truncated offload bundle: entry {i} header")
        offset, size, id_len = struct.unpack_from("<QQQ", data, pos)
        pos += 24
        if id_len > MAX_ID:
            raise FormatError(f"bad offload bundle: entry {i} ID is {id_len} bytes long")
        if pos + id_len > len(data):
            raise FormatError(f"truncated offload bundle: entry {i} ID")
        entry_id = data[pos : pos + id_len].decode("utf-8", "replace")
        pos += id_len
        if offset + size > len(data):
            raise FormatError(
                f"truncated offload bundle: {entry_id} needs {offset + size} bytes, file has {len(data)}"
            )
        end = max(end, offset + size, pos)
        entries.append(BundleEntry(entry_id, data[offset : offset + size]))
    return entries, end


def entry_target(entry_id: str) -> str:
    """Target ID of an entry: hipv4-amdgcn-amd-amdhsa--gfx942:xnack- -> gfx942:xnack-."""
    parts = entry_id.split("-", 5)
    return parts[5] if len(parts) == 6 else ""

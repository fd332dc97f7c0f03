"""Fast GGUF header parser over a memory map.

`gguf.GGUFReader` builds a numpy view per array item, which takes tens of seconds for a 262k-token
vocabulary; this parser reads the same header with `struct` and vectorised numpy, using the `gguf`
package's type constants, and reports exactly where a file is truncated or corrupt.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

_SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY_TYPES: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
MAX_STRING_BYTES = 1 << 30
MAX_COUNT = 1 << 40


class HeaderError(Exception):
    """Corrupt or truncated header; the message says where."""


@dataclass(frozen=True)
class RawTensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: ne0 (columns) first
    type_id: int
    offset: int  # relative to the start of the data section


@dataclass
class Header:
    version: int
    metadata: dict[str, Any]
    value_types: dict[str, GGUFValueType]
    item_types: dict[str, GGUFValueType]  # element type of each ARRAY value (needed to write it back)
    tensors: list[RawTensorInfo]
    data_start: int


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes):
        self.buf = buf
        self.pos = 0
        self.size = len(buf)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise HeaderError(f"truncated while reading {what} at byte {self.pos} (file has {self.size})")

    def unpack(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        length = self.unpack("<Q", what)
        if length > MAX_STRING_BYTES:
            raise HeaderError(f"implausible string length {length} in {what} at byte {self.pos - 8}")
        self.need(length, what)
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: GGUFValueType, what: str) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype == GGUFValueType.ARRAY:
            item_type = self.value_type(what)
            count = self.unpack("<Q", what)
            if count > MAX_COUNT:
                raise HeaderError(f"implausible array length {count} in {what}")
            if item_type == GGUFValueType.STRING:
                return [self.string(what) for _ in range(count)]
            if item_type == GGUFValueType.ARRAY:
                return [self.value(GGUFValueType.ARRAY, what) for _ in range(count)]
            dtype = np.dtype(_NUMPY_TYPES[item_type])
            self.need(count * dtype.itemsize, what)
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return arr.tolist()
        return self.unpack(_SCALAR_FORMATS[vtype], what)

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.unpack("<I", what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise HeaderError(f"unknown metadata value type {raw} in {what}") from None


def parse_header(buf: mmap.mmap | bytes) -> Header:
    """Parse magic, version, metadata and tensor infos; tensor data is left in place."""
    cur = _Cursor(buf)
    cur.need(4, "magic")
    cur.pos = 4
    version = cur.unpack("<I", "version")
    n_tensors = cur.unpack("<Q", "tensor count")
    n_kv = cur.unpack("<Q", "metadata count")
    if n_tensors > MAX_COUNT or n_kv > MAX_COUNT:
        raise HeaderError(f"implausible counts: {n_tensors} tensors, {n_kv} metadata keys")
    metadata: dict[str, Any] = {}
    value_types: dict[str, GGUFValueType] = {}
    item_types: dict[str, GGUFValueType] = {}
    for index in range(n_kv):
        key = cur.string(f"metadata key #{index}")
        vtype = cur.value_type(f"metadata '{key}'")
        if vtype == GGUFValueType.ARRAY:  # peek at the element type; value() reads it again
            start = cur.pos
            item_types[key] = cur.value_type(f"metadata '{key}'")
            cur.pos = start
        metadata[key] = cur.value(vtype, f"metadata '{key}'")
        value_types[key] = vtype
    tensors: list[RawTensorInfo] = []
    for index in range(n_tensors):
        name = cur.string(f"tensor info #{index}")
        n_dims = cur.unpack("<I", f"tensor {name}")
        if n_dims > 8:
            raise HeaderError(f"tensor {name} has {n_dims} dimensions (at most 8 supported)")
        dims = tuple(cur.unpack("<Q", f"tensor {name}") for _ in range(n_dims))
        type_id = cur.unpack("<I", f"tensor {name}")
        offset = cur.unpack("<Q", f"tensor {name}")
        tensors.append(RawTensorInfo(name, dims, type_id, offset))
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise HeaderError(f"invalid general.alignment {alignment!r}")
    data_start = (cur.pos + alignment - 1) // alignment * alignment
    return Header(version, metadata, value_types, item_types, tensors, data_start)

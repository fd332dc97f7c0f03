"""Open a GGUF file (memory-mapped) and validate it before use."""

from __future__ import annotations

import mmap
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from gufo.errors import BadInputError
from gufo.gguf.header import HeaderError, parse_header

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's raw GGUF blocks, memory-mapped, without copying.

    `shape` is in PyTorch order (rows first): a GGUF [ne0=cols, ne1=rows] matrix has shape (rows, cols).
    `data` is a read-only uint8 view of the tensor's bytes, shaped (rows..., bytes per row).
    """

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    n_bytes: int
    data: np.ndarray

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


class ModelFile:
    """A validated GGUF file: metadata as Python values and memory-mapped tensors (`mapped` False: the
    file is read into memory instead, llama.cpp's --no-mmap)."""

    def __init__(self, path: Path, mapped: bool = True):
        self.path = path
        self.label = path.name
        with open(path, "rb") as handle:
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if mapped else handle.read()
        self.file_size = len(self._map)
        try:
            header = parse_header(self._map)
        except HeaderError as err:
            raise BadInputError(f"{self.label}: {err}") from None
        self.version = header.version
        self.metadata: dict[str, Any] = header.metadata
        self.value_types = header.value_types
        self.item_types = header.item_types
        whole = np.frombuffer(self._map, dtype=np.uint8)
        # What the model read while it was built: a tensor or math-bearing key it did not read is refused
        # (gufo.models.registry.check_fully_read).
        self.used_tensors: set[str] = set()
        self.read_keys: set[str] = set()
        # told of each tensor the first time the model asks for it (a load's progress)
        self.on_first_read: Callable[[TensorInfo], None] | None = None
        self.tensors: dict[str, TensorInfo] = {}
        for raw in header.tensors:
            if raw.name in self.tensors:
                raise BadInputError(f"{self.label}: tensor {raw.name} appears twice")
            try:
                qtype = GGMLQuantizationType(raw.type_id)
            except ValueError:
                raise BadInputError(
                    f"{self.label}: tensor {raw.name} has unknown type id {raw.type_id}"
                ) from None
            block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
            if not raw.dims or any(d <= 0 for d in raw.dims):
                raise BadInputError(f"{self.label}: tensor {raw.name} has invalid dimensions {raw.dims}")
            cols = raw.dims[0]
            if cols % block_elems:
                raise BadInputError(
                    f"{self.label}: tensor {raw.name} ({qtype.name}) has {cols} columns, "
                    f"not a multiple of its block size {block_elems}"
                )
            start = header.data_start + raw.offset
            row_bytes = cols // block_elems * block_bytes
            n_rows = int(np.prod(raw.dims[1:], dtype=np.int64)) if len(raw.dims) > 1 else 1
            end = start + row_bytes * n_rows
            if end > self.file_size:
                raise BadInputError(
                    f"{self.label}: tensor {raw.name} ends at byte {end}, file has {self.file_size}"
                )
            shape = tuple(reversed(raw.dims))
            data = whole[start:end].reshape(*shape[:-1], row_bytes)
            self.tensors[raw.name] = TensorInfo(raw.name, qtype, shape, start, end - start, data)

    @property
    def architecture(self) -> str:
        return str(self.require("general.architecture"))

    def get(self, key: str, default: Any = None) -> Any:
        self.read_keys.add(key)
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        self.read_keys.add(key)
        if key not in self.metadata:
            raise BadInputError(f"{self.label}: required metadata key '{key}' is missing")
        return self.metadata[key]

    def arch_key(self, suffix: str, default: Any = ...) -> Any:
        """Read `<architecture>.<suffix>`; required unless a default is given."""
        key = f"{self.architecture}.{suffix}"
        if default is ...:
            return self.require(key)
        return self.get(key, default)

    def tensor(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise BadInputError(f"{self.label}: required tensor '{name}' is missing")
        info = self.tensors[name]
        if name not in self.used_tensors:
            self.used_tensors.add(name)
            if self.on_first_read is not None:
                self.on_first_read(info)
        return info

    def optional_tensor(self, name: str) -> TensorInfo | None:
        """The tensor when the file has it (e.g. a projection's bias), else None."""
        return self.tensor(name) if name in self.tensors else None

    def type_histogram(self) -> Counter[str]:
        return Counter(t.qtype.name for t in self.tensors.values())

    def n_parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())


def open_model_file(path: str | os.PathLike[str], mapped: bool = True) -> ModelFile:
    """Open and validate a GGUF file (memory-mapped unless `mapped` is False); every problem becomes
    one BadInputError line naming the file."""
    path = Path(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as err:
        raise BadInputError(f"{path}: cannot open: {err.strerror}") from None
    if size == 0:
        raise BadInputError(f"{path.name}: file is empty, expected a GGUF model")
    if head[:4] != GGUF_MAGIC:
        raise BadInputError(f"{path.name}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    if len(head) < 8:
        raise BadInputError(f"{path.name}: file is truncated inside the GGUF header ({size} bytes)")
    version = int.from_bytes(head[4:8], "little")
    if version not in SUPPORTED_VERSIONS:
        raise BadInputError(f"{path.name}: GGUF version {version} is not supported (supported: 2, 3)")
    return ModelFile(path, mapped)

"""Open a GGUF model, one file or the parts of a split file (memory-mapped), and validate it before use."""

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
from gufo.gguf.header import HeaderError, RawTensorInfo, parse_header
from gufo.gguf.split import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT, part_paths

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
    offset: int  # in its file (of a split file: in its part)
    n_bytes: int
    data: np.ndarray

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class FilePart:
    """One file of a model: the whole file, or one part of a split file."""

    path: Path
    size: int  # bytes
    n_tensors: int


class _MappedFile:
    """One GGUF file, memory-mapped read-only (`mapped` False: read into memory instead, llama.cpp's
    --no-mmap) and checked; every error names the file."""

    def __init__(self, path: Path, mapped: bool = True):
        self.path = path
        self.label = path.name
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as handle:
                head = handle.read(8)
                if not size:
                    self._map = None
                elif mapped:
                    self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                else:
                    handle.seek(0)
                    self._map = handle.read()
        except OSError as err:
            raise BadInputError(f"{path}: cannot open: {err.strerror}") from None
        if size == 0:
            raise BadInputError(f"{self.label}: file is empty, expected a GGUF model")
        if head[:4] != GGUF_MAGIC:
            raise BadInputError(f"{self.label}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
        if len(head) < 8:
            raise BadInputError(f"{self.label}: file is truncated inside the GGUF header ({size} bytes)")
        version = int.from_bytes(head[4:8], "little")
        if version not in SUPPORTED_VERSIONS:
            raise BadInputError(f"{self.label}: GGUF version {version} is not supported (supported: 2, 3)")
        self.size = size
        try:
            self.header = parse_header(self._map)
        except HeaderError as err:
            raise BadInputError(f"{self.label}: {err}") from None
        whole = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors: dict[str, TensorInfo] = {}
        for raw in self.header.tensors:
            if raw.name in self.tensors:
                raise BadInputError(f"{self.label}: tensor {raw.name} appears twice")
            self.tensors[raw.name] = self._tensor(raw, whole)

    def _tensor(self, raw: RawTensorInfo, whole: np.ndarray) -> TensorInfo:
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
        start = self.header.data_start + raw.offset
        row_bytes = cols // block_elems * block_bytes
        n_rows = int(np.prod(raw.dims[1:], dtype=np.int64)) if len(raw.dims) > 1 else 1
        end = start + row_bytes * n_rows
        if end > self.size:
            raise BadInputError(f"{self.label}: tensor {raw.name} ends at byte {end}, file has {self.size}")
        shape = tuple(reversed(raw.dims))
        data = whole[start:end].reshape(*shape[:-1], row_bytes)
        return TensorInfo(raw.name, qtype, shape, start, end - start, data)

    def split_key(self, key: str) -> int | None:
        value = self.header.metadata.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise BadInputError(f"{self.label}: invalid {key} {value!r}")
        return value


class ModelFile:
    """A validated GGUF model, one file or all parts of a split file: the metadata as Python values
    (from the first part) and the tensors of every part, memory-mapped."""

    def __init__(self, files: list[_MappedFile]):
        first = files[0]
        self.path = first.path
        self.label = first.label
        self.parts = [FilePart(f.path, f.size, len(f.tensors)) for f in files]
        self.file_size = sum(part.size for part in self.parts)
        self.version = first.header.version
        self.metadata: dict[str, Any] = first.header.metadata
        self.value_types = first.header.value_types
        self.item_types = first.header.item_types
        self._files = files  # holds the memory maps the tensors view
        # What the model read while it was built: a tensor or math-bearing key it did not read is refused
        # (gufo.models.registry.check_fully_read).
        self.used_tensors: set[str] = set()
        self.read_keys: set[str] = set()
        # told of each tensor the first time the model asks for it (a load's progress)
        self.on_first_read: Callable[[TensorInfo], None] | None = None
        self.tensors: dict[str, TensorInfo] = {name: t for f in files for name, t in f.tensors.items()}

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
    """Open and validate a GGUF file, with all its parts when it is one part of a split file (any part
    finds the others), memory-mapped unless `mapped` is False; every problem becomes one BadInputError
    line naming the file or part."""
    given = _MappedFile(Path(path), mapped)
    index, count = given.split_key(SPLIT_NO), given.split_key(SPLIT_COUNT)
    if count is None or count == 1:
        if index not in (None, 0):
            raise BadInputError(f"{given.label}: split.no is {index}, but split.count is {count}")
        return ModelFile([given])
    if index is None or count == 0 or index >= count:
        raise BadInputError(f"{given.label}: invalid split.no {index} for split.count {count}")
    try:
        paths = part_paths(given.path, index, count)
    except ValueError as err:
        raise BadInputError(f"{given.label}: {err}") from None
    files = [
        given if i == index else _open_part(p, i, count, given.label, mapped) for i, p in enumerate(paths)
    ]
    _check_parts(files, given.label)
    return ModelFile(files)


def _open_part(path: Path, index: int, count: int, found_from: str, mapped: bool) -> _MappedFile:
    if not path.exists():
        raise BadInputError(f"{path.name}: missing, part {index + 1} of {count} of the split {found_from}")
    return _MappedFile(path, mapped)


def _check_parts(files: list[_MappedFile], given: str) -> None:
    """Every part says it is the part its name says, of as many parts as `given` (the part named on the
    command line) says and of as many tensors as the first part says, and the parts hold that many
    tensors, each once."""
    first = files[0]
    count, n_tensors = len(files), first.split_key(SPLIT_TENSORS_COUNT)
    if n_tensors is None:
        raise BadInputError(f"{first.label}: split.tensors.count is missing")
    for index, file in enumerate(files):
        part_count, part_index = file.split_key(SPLIT_COUNT), file.split_key(SPLIT_NO)
        if part_count != count:
            raise BadInputError(
                f"{file.label}: split.count is {part_count}, but its name and {given} say {count} "
                "(parts of different files?)"
            )
        if part_index != index:
            raise BadInputError(
                f"{file.label}: split.no is {part_index}, but its name says part {index + 1} "
                f"(split.no {index}; a renamed part?)"
            )
        part_tensors = file.split_key(SPLIT_TENSORS_COUNT)
        if part_tensors != n_tensors:
            raise BadInputError(
                f"{file.label}: split.tensors.count is {part_tensors}, but {first.label} says {n_tensors} "
                "(parts of different files?)"
            )
    holder: dict[str, str] = {}
    for file in files:
        for name in file.tensors:
            if name in holder:
                raise BadInputError(
                    f"{file.label}: tensor {name} is also in {holder[name]} (parts of different files?)"
                )
            holder[name] = file.label
    held = len(holder)
    if held != n_tensors:
        per_part = ", ".join(str(len(file.tensors)) for file in files)
        raise BadInputError(
            f"{first.label}: split.tensors.count is {n_tensors}, but the {count} parts hold {held} tensors "
            f"({per_part}; parts of different files?)"
        )

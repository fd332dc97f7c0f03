"""Triton cache directories: every compiled kernel (`*.hsaco`, `*.cubin`) below a directory,
with the dynamic shared memory from the kernel's metadata JSON counted in NVIDIA occupancy."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gufo.kernres.cubin import set_occupancy
from gufo.kernres.model import FormatError, Kernel

SUFFIXES = (".hsaco", ".cubin")
MAX_FILES = 100_000


def read_dir(root: Path, read_blob: Callable[[bytes, list[str]], list[Kernel]]) -> list[Kernel]:
    files = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    if not files:
        raise FormatError("directory holds no .hsaco or .cubin files")
    if len(files) > MAX_FILES:
        raise FormatError(f"directory holds more than {MAX_FILES} kernel files")
    kernels: list[Kernel] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        try:
            found = read_blob(path.read_bytes(), [f"triton:{rel}"])
        except FormatError as err:
            raise FormatError(f"{rel}: {err}") from None
        shared = _dynamic_shared(path)
        for k in found:
            if k.vendor == "nvidia" and shared:
                set_occupancy(k, k.block_size if k.block_size != k.values["max_threads_per_block"] else None,
                              dynamic_shared=shared)  # fmt: skip
                k.notes.append(f"occupancy counts Triton's {shared} bytes of dynamic shared memory")
        kernels += found
    return kernels


def _dynamic_shared(kernel_file: Path) -> int:
    """Triton's metadata JSON beside the kernel (same stem) gives the shared memory it launches with."""
    meta = kernel_file.with_suffix(".json")
    try:
        value = json.loads(meta.read_text()).get("shared", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0

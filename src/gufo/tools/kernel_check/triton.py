"""Triton cache directories: every compiled kernel (`*.hsaco`, `*.cubin`) below a directory. The kernel's
metadata JSON beside it (same stem) says how Triton launches it: the block size (num_warps x warp size)
and the shared memory / LDS it allocates at launch, which occupancy then counts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gufo.tools.kernel_check import amdgpu, cubin
from gufo.tools.kernel_check.model import FormatError, Kernel

SUFFIXES = (".hsaco", ".cubin")
MAX_FILES = 100_000
LAUNCH_NOTE = "bytes of shared memory/LDS Triton allocates at launch"


def read_dir(
    root: Path, read_blob: Callable[[bytes, list[str]], list[Kernel]], block_size: int | None
) -> list:
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
        meta = _metadata(path)
        for k in found:
            _apply_launch(k, meta, block_size)
        kernels += found
    return kernels


def _apply_launch(k: Kernel, meta: dict, block_size: int | None) -> None:
    shared = meta.get("shared", 0)
    shared = shared if isinstance(shared, int) and shared > 0 else 0
    if k.vendor == "nvidia":
        warps, warp = meta.get("num_warps"), meta.get("warp_size", 32)
        launch = warps * warp if isinstance(warps, int) and isinstance(warp, int) and warps > 0 else None
        cubin.set_occupancy(k, block_size or launch, dynamic_shared=shared)
    elif shared:
        amdgpu.set_occupancy(k, dynamic_lds=shared)
    if shared:
        k.notes.append(f"occupancy counts the {shared} {LAUNCH_NOTE}")


def _metadata(kernel_file: Path) -> dict:
    try:
        meta = json.loads(kernel_file.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}

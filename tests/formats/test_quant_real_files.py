"""Dequantize one tensor of each type in the two real model files; compare with dequant.json goldens.

The goldens (../shared/goldens/dequant.json) hold the sha256 of gguf-py's float32 output, which ggml's
own to_float reproduces bit for bit, and the sha256 of the raw block bytes (so the test also proves it
read the right bytes). The file is read with gufo's memory-mapped reader: gguf.GGUFReader needs ~30 s
to build the metadata of the 262k-token vocabulary on this machine.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from gufo.formats import FLOAT_QTYPES, dequantize, unpack
from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import ModelFile, open_model_file

GOLDENS = Path(__file__).resolve().parents[2].parent / "shared" / "goldens" / "dequant.json"
MODEL_ALIASES = {
    "SmolLM2-135M-Instruct.Q4_1": "smollm2-135m",
    "gemma-3-270m-q4_k_m": "gemma3-270m",
}


def golden_tensors() -> list[dict]:
    if not GOLDENS.exists():
        return [{"missing": str(GOLDENS)}]
    return json.loads(GOLDENS.read_text())["tensors"]


@cache
def model(name: str) -> ModelFile:
    return open_model_file(resolve_model(MODEL_ALIASES[name]))


@pytest.mark.parametrize("golden", golden_tensors(), ids=lambda g: f"{g.get('model')}:{g.get('name')}")
def test_real_tensor_matches_golden(golden: dict) -> None:
    if "missing" in golden:
        pytest.fail(f"golden file missing: {golden['missing']}")
    tensor = model(golden["model"]).tensor(golden["name"])
    assert tensor.qtype.name == golden["type"]
    assert hashlib.sha256(tensor.data.tobytes()).hexdigest() == golden["raw_bytes_sha256"]

    n_cols = golden["ggml_ne"][0]
    out = dequantize(tensor.qtype, tensor.data, n_cols)
    assert out.dtype == torch.float32
    assert list(out.shape) == golden["numpy_shape"]
    values = out.numpy()
    assert hashlib.sha256(values.tobytes()).hexdigest() == golden["sha256_f32"]
    assert values.reshape(-1)[:8].tolist() == golden["first8"]
    assert values.astype(np.float64).sum() == pytest.approx(golden["sum"], rel=1e-9, abs=1e-9)
    if tensor.qtype not in FLOAT_QTYPES:
        assert unpack(tensor.qtype, tensor.data).q.shape == (golden["numpy_shape"][0], n_cols)

"""gufo synth's per-tensor types against what llama-quantize itself chose (fixture made by
make_type_mix_fixture.py from llama.cpp's llama-quantize)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from gufo.errors import BadInputError
from gufo.tools.synth.presets import Qwen3Shape
from gufo.tools.synth.type_mix import MIXES, find_mix, tensor_type

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "llama_quantize_types.json").read_text())
CASES = [(model, name) for model in FIXTURE["models"] for name in model["mixes"]]


def test_fixture_covers_every_supported_mix():
    for model in FIXTURE["models"]:
        assert set(model["mixes"]) == set(MIXES)


def case_id(model: dict, mix_name: str) -> str:
    shape = model["shape"]
    gqa = shape["num_attention_heads"] // shape["num_key_value_heads"]
    return f"{shape['num_hidden_layers']}layers-gqa{gqa}-{mix_name}"


@pytest.mark.parametrize("model,mix_name", CASES, ids=[case_id(*case) for case in CASES])
def test_types_equal_llama_quantize(model, mix_name):
    shape = Qwen3Shape(**model["shape"])
    mix = find_mix(mix_name)
    recorded = model["mixes"][mix_name]
    assert int(mix.file_type) == recorded["file_type"]
    assert mix.imatrix == recorded["imatrix"]  # llama-quantize refused the mix without one
    for kind, types in recorded["types"].items():
        if kind in ("token_embd", "output", "output_norm"):
            assert tensor_type(mix, kind, -1, shape).name == types, kind
        else:
            ours = [tensor_type(mix, kind, layer, shape).name for layer in range(shape.num_hidden_layers)]
            assert ours == types.split(), kind
    assert ("output" in recorded["types"]) != shape.tie_word_embeddings


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("MXFP4_MOE", "does not generate"),
        ("Q2_K_S", "does not generate"),
        ("NVFP4", "does not generate"),
        ("BF16", "does not generate"),
        ("F32", "does not generate"),
        ("Q7_K", "unknown quantization type"),
    ],
)
def test_refused_mixes_say_why(name, fragment):
    with pytest.raises(BadInputError, match=fragment):
        find_mix(name)


def test_mix_names_are_case_insensitive():
    assert find_mix("q4_k_m") is MIXES["Q4_K_M"]
    assert MIXES["Q4_K_M"].base == GGMLQuantizationType.Q4_K

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


def test_ud_q4_k_xl_follows_its_documented_rule():
    """docs/decisions.md's UD-Q4_K_XL rule on 16 layers, written out by hand: llama.cpp's more-bits layers
    (the first and last 2, then every third: 4, 7, 10, 13) get Q6_K on attn_v and ffn_down, the rest Q5_K;
    the other matrices Q4_K in layers 0-1 and 14-15, IQ4_NL (attn_output) or IQ4_XS between."""
    shape = Qwen3Shape(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
    )  # fmt: skip
    mix = find_mix("ud-q4_k_xl")
    assert mix.file_type.name == "MOSTLY_Q4_K_M" and mix.base == GGMLQuantizationType.Q4_K
    more_bits = {0, 1, 4, 7, 10, 13, 14, 15}
    ends = {0, 1, 14, 15}
    for layer in range(16):
        for kind in ("attn_v", "ffn_down"):
            assert tensor_type(mix, kind, layer, shape).name == ("Q6_K" if layer in more_bits else "Q5_K")
        for kind, middle in (("attn_q", "IQ4_XS"), ("ffn_up", "IQ4_XS"), ("attn_output", "IQ4_NL")):
            assert tensor_type(mix, kind, layer, shape).name == ("Q4_K" if layer in ends else middle)
    assert tensor_type(mix, "output", -1, shape).name == "Q6_K"
    assert tensor_type(mix, "token_embd", -1, shape).name == "Q4_K"
    assert tensor_type(mix, "ffn_norm", 3, shape).name == "F32"

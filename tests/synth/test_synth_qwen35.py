"""`gufo synth --arch qwen35`: the converter's tensor names (gguf-py), the shapes of transformers' Qwen3.5
built from the official configs, llama-quantize's type mix, sane float tensors, and a file gufo runs."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from converter_layout import converter_names, gguf_dims, kind_and_layer
from gguf.quants import dequantize

from gufo.cli.main import main
from gufo.engine.engine import Engine
from gufo.tools.quality.validate_prefill import validate_prefill
from gufo.tools.synth.plan import plan_synth
from gufo.tools.synth.presets import find_preset
from gufo.tools.synth.type_mix import find_mix

# Qwen/Qwen3.5-0.8B and Qwen/Qwen3.5-27B config.json, text_config (both: linear_num_key_heads 16,
# linear_key_head_dim = linear_value_head_dim = 128, linear_conv_kernel_dim 4, full_attention_interval 4,
# rope_theta 1e7, partial_rotary_factor 0.25, mrope_section [11, 11, 10], rms_norm_eps 1e-6,
# max_position_embeddings 262144).
HF_CONFIGS = {
    "0.8b": dict(
        hidden_size=1024,
        num_hidden_layers=24,
        intermediate_size=3584,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_value_heads=16,
        tie_word_embeddings=True,
    ),
    "27b": dict(
        hidden_size=5120,
        num_hidden_layers=64,
        intermediate_size=17408,
        num_attention_heads=24,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_value_heads=48,
        tie_word_embeddings=False,
    ),
}
LAYERS = 4  # three DeltaNet layers, then full attention
N_VOCAB = 49152


def hf_gguf_dims(preset: str, n_layers: int) -> dict[str, tuple[int, ...]]:
    """The converter's dims of transformers' Qwen3.5 of `preset` (built on the meta device, no memory)."""
    import transformers

    hf = HF_CONFIGS[preset] | {"num_hidden_layers": n_layers}
    config = transformers.Qwen3_5TextConfig(
        **hf,
        vocab_size=N_VOCAB,
        linear_num_key_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
    )
    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(config)
    return gguf_dims(model, gguf.MODEL_ARCH.QWEN35, n_layers)


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "qwen35-0.8b-q4_k_m.gguf"
    args = ["synth", "--arch", "qwen35", "--preset", "0.8b", "--layers", str(LAYERS), "-o", str(out)]
    assert main(args) == 0
    return out


@pytest.mark.parametrize("preset", sorted(HF_CONFIGS))
def test_every_preset_plans_the_converter_names_and_hf_shapes(vocab, preset):
    plan = plan_synth(preset, find_preset("qwen35", preset).with_layers(LAYERS), find_mix("Q4_K_M"), vocab)
    planned = {t.name: tuple(reversed(t.shape)) for t in plan.tensors}
    assert planned == hf_gguf_dims(preset, LAYERS)
    assert set(planned) <= converter_names(gguf.MODEL_ARCH.QWEN35, LAYERS)


def test_presets_have_the_hf_layer_counts():
    for preset, hf in HF_CONFIGS.items():
        assert find_preset("qwen35", preset).num_hidden_layers == hf["num_hidden_layers"]


def test_file_has_the_converter_metadata(reader):
    assert {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors} == hf_gguf_dims("0.8b", LAYERS)
    meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert meta["general.architecture"] == "qwen35"
    assert meta["general.file_type"] == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    expected = {
        "block_count": LAYERS,
        "context_length": 262144,
        "embedding_length": 1024,
        "feed_forward_length": 3584,
        "attention.head_count": 8,
        "attention.head_count_kv": 2,
        "attention.key_length": 256,
        "attention.value_length": 256,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-6),
        "rope.freq_base": pytest.approx(1e7),
        "rope.dimension_count": 64,  # head_dim * partial_rotary_factor
        "rope.dimension_sections": [11, 11, 10, 0],
        "ssm.conv_kernel": 4,
        "ssm.state_size": 128,
        "ssm.group_count": 16,
        "ssm.time_step_rank": 16,
        "ssm.inner_size": 16 * 128,
        "full_attention_interval": 4,
    }
    assert {key: meta[f"qwen35.{key}"] for key in expected} == expected


# llama-quantize's choices (src/llama-quant.cpp, llama_tensor_get_type) for an 8-layer 0.8B, written out
# by hand: layers 3 and 7 are full attention. use_more_bits(i, 8) holds for i in {0, 3, 6, 7}; attn_qkv
# is attn_v-like there and shares its counter, so together they count layers 0..7. Tied embeddings take
# the output's type (Q6_K, or Q8_0 in a Q8_0 file). 1-D tensors and ssm_conv1d are never quantized.
MIX_LAYERS = 8
MIX_TABLE = {
    "Q4_K_M": {
        "token_embd": "Q6_K",
        "attn_qkv": "Q6_K Q4_K Q4_K - Q4_K Q4_K Q6_K -",
        "attn_v": "- - - Q6_K - - - Q6_K",
        "ffn_down": "Q6_K Q4_K Q4_K Q6_K Q4_K Q4_K Q6_K Q6_K",
        "attn_output": "- - - Q4_K - - - Q4_K",
        "other": "Q4_K",
    },
    "Q3_K_M": {  # attn_v-like: Q5_K below counter 2; ffn_down: Q5_K below 8 / 16 = 0, else Q4_K
        "token_embd": "Q6_K",
        "attn_qkv": "Q5_K Q5_K Q4_K - Q4_K Q4_K Q4_K -",
        "attn_v": "- - - Q4_K - - - Q4_K",
        "ffn_down": "Q4_K Q4_K Q4_K Q4_K Q4_K Q4_K Q4_K Q4_K",
        "attn_output": "- - - Q4_K - - - Q4_K",
        "other": "Q3_K",
    },
    "Q2_K": {  # n_gqa = 8 / 2 = 4: attn_v-like Q4_K; ffn_down Q3_K; attn_output Q3_K
        "token_embd": "Q6_K",
        "attn_qkv": "Q4_K Q4_K Q4_K - Q4_K Q4_K Q4_K -",
        "attn_v": "- - - Q4_K - - - Q4_K",
        "ffn_down": "Q3_K Q3_K Q3_K Q3_K Q3_K Q3_K Q3_K Q3_K",
        "attn_output": "- - - Q3_K - - - Q3_K",
        "other": "Q2_K",
    },
    "Q8_0": {"token_embd": "Q8_0", "other": "Q8_0"},
    "Q4_0": {"token_embd": "Q6_K", "other": "Q4_0"},
    "F16": {"token_embd": "F16", "other": "F16"},
}
FLOAT_KINDS = {"ssm_a", "ssm_dt", "ssm_conv1d"}


def expected_type(table: dict[str, str], kind: str, layer: int) -> str:
    if kind.endswith("norm") or kind in FLOAT_KINDS:
        return "F32"
    if kind in table and layer >= 0:
        return table[kind].split()[layer]
    return table.get(kind, table["other"])


@pytest.mark.parametrize("mix_name", sorted(MIX_TABLE))
def test_types_follow_llama_quantize(vocab, mix_name):
    shape = find_preset("qwen35", "0.8b").with_layers(MIX_LAYERS)
    plan = plan_synth("0.8b", shape, find_mix(mix_name), vocab)
    table = MIX_TABLE[mix_name]
    for tensor in plan.tensors:
        assert tensor.qtype.name == expected_type(table, tensor.kind, tensor.layer), tensor.name


def test_untied_27b_output_is_q6_k_and_embedding_the_base(vocab):
    shape = find_preset("qwen35", "27b").with_layers(LAYERS)
    types = {t.name: t.qtype.name for t in plan_synth("27b", shape, find_mix("Q4_K_M"), vocab).tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"


def test_file_types_and_values(reader):
    table = MIX_TABLE["Q4_K_M"] | {"attn_qkv": "Q4_K Q4_K Q6_K -", "attn_v": "- - - Q6_K"}
    table |= {"ffn_down": "Q4_K Q4_K Q6_K Q6_K", "attn_output": "- - - Q4_K"}  # use_more_bits(i, 4): 2, 3
    for tensor in reader.tensors:
        kind, layer = kind_and_layer(tensor.name)
        assert tensor.tensor_type.name == expected_type(table, kind, layer), tensor.name
        values = dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), tensor.name
        if kind == "ssm_a":  # -exp(A_log): a decay rate, negative so the state fades
            assert ((values >= -16) & (values <= -1)).all()
        elif kind == "ssm_conv1d":
            assert np.abs(values).max() <= 0.5 and values.std() > 0.2
        elif len(tensor.shape) == 1:  # norms and dt_bias
            assert (values == 1.0).all(), tensor.name
        else:
            assert 0.018 < values.std() < 0.022, tensor.name


def test_gufo_runs_the_file_and_prefill_matches_decode(synth_file):
    engine = Engine(synth_file, context=128)
    assert engine.model.recurrent_layers == (0, 1, 2)
    logits = engine.prefill([1, 2, 3, 4])
    assert logits.shape == (N_VOCAB,) and torch.isfinite(logits).all()
    assert torch.isfinite(engine.decode(5, 4)).all()
    result = validate_prefill(engine, 64)
    assert result.passed, result.lines()


def test_preset_of_another_arch_gives_one_line_and_exit_2(tmp_path, capsys):
    code = main(["synth", "--arch", "qwen35", "--preset", "0.6b", "-o", str(tmp_path / "x.gguf")])
    err = capsys.readouterr().err
    assert code == 2 and "--preset 0.6b: unknown qwen35 preset (known: 0.8b, 27b)" in err
    assert len(err.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []

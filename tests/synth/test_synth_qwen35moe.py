"""`gufo synth --arch qwen35moe`: Qwen3.5-35B-A3B's shape (the public config, which transformers also
ships as Qwen3_5MoeTextConfig's defaults), the converter's tensor names (gguf-py's QWEN35MOE list) and
shapes (transformers' Qwen3_5MoeForCausalLM, split as convert_hf_to_gguf.py splits it), llama-quantize's
types for the expert tensors, and a file gufo runs."""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import pytest
import torch
from converter_layout import converter_names, gguf_dims, kind_and_layer

from gufo.cli.main import main
from gufo.engine.engine import Engine
from gufo.tools.quality.validate_prefill import validate_prefill
from gufo.tools.synth.plan import plan_synth
from gufo.tools.synth.presets import find_preset
from gufo.tools.synth.type_mix import find_mix

# Qwen/Qwen3.5-35B-A3B config.json, text_config (also rope_theta 1e7, partial_rotary_factor 0.25,
# mrope_section [11, 11, 10], rms_norm_eps 1e-6, max_position_embeddings 262144, vocab_size 248320)
HF_35B_A3B = dict(
    hidden_size=2048,
    num_hidden_layers=40,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    full_attention_interval=4,
    num_experts=256,
    num_experts_per_tok=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    tie_word_embeddings=False,
)
LAYERS = 4  # three DeltaNet layers, then full attention
N_VOCAB = 49152  # the synth tests' vocabulary (smollm2-135m)


def hf_config(preset: str, n_layers: int):
    import transformers

    shape = find_preset("qwen35moe", preset)
    fields = {name: getattr(shape, name) for name in HF_35B_A3B} | {"num_hidden_layers": n_layers}
    return transformers.Qwen3_5MoeTextConfig(**fields, vocab_size=N_VOCAB)


def hf_gguf_dims(preset: str, n_layers: int) -> dict[str, tuple[int, ...]]:
    """The converter's dims of transformers' Qwen3.5-MoE of `preset` (on the meta device)."""
    import transformers

    with torch.device("meta"):
        model = transformers.Qwen3_5MoeForCausalLM(hf_config(preset, n_layers))
    return gguf_dims(model, gguf.MODEL_ARCH.QWEN35MOE, n_layers)


def test_the_35b_a3b_preset_is_the_public_config():
    import transformers

    shape = find_preset("qwen35moe", "35b-a3b")
    assert {name: getattr(shape, name) for name in HF_35B_A3B} == HF_35B_A3B
    defaults = transformers.Qwen3_5MoeTextConfig()  # transformers ships this model's config as defaults
    assert {name: getattr(defaults, name) for name in HF_35B_A3B if hasattr(defaults, name)} == {
        name: value for name, value in HF_35B_A3B.items() if hasattr(defaults, name)
    }
    assert (shape.rope_theta, shape.partial_rotary_factor, shape.mrope_section) == (1e7, 0.25, (11, 11, 10))


@pytest.mark.parametrize("preset", ["35b-a3b", "tiny"])
def test_presets_plan_the_converter_names_and_hf_shapes(vocab, preset):
    shape = find_preset("qwen35moe", preset).with_layers(LAYERS)
    plan = plan_synth(preset, shape, find_mix("Q4_K_M"), vocab)
    planned = {t.name: tuple(reversed(t.shape)) for t in plan.tensors}
    assert planned == hf_gguf_dims(preset, LAYERS)
    assert set(planned) <= converter_names(gguf.MODEL_ARCH.QWEN35MOE, LAYERS)


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "qwen35moe-tiny-q4_k_m.gguf"
    assert main(["synth", "--arch", "qwen35moe", "--preset", "tiny", "-o", str(out)]) == 0
    return out


def test_file_has_the_converter_metadata_and_types(reader):
    assert {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors} == hf_gguf_dims("tiny", LAYERS)
    meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert meta["general.architecture"] == "qwen35moe"
    expected = {
        "block_count": LAYERS,
        "embedding_length": 256,
        "expert_count": 16,
        "expert_used_count": 4,
        "expert_feed_forward_length": 256,
        "expert_shared_feed_forward_length": 256,
        "ssm.group_count": 2,
        "ssm.time_step_rank": 4,
        "ssm.state_size": 64,
        "ssm.inner_size": 4 * 64,
        "rope.dimension_count": 16,  # head_dim * partial_rotary_factor
        "full_attention_interval": 4,
    }
    assert {key: meta[f"qwen35moe.{key}"] for key in expected} == expected
    assert "qwen35moe.feed_forward_length" not in meta  # no dense FFN: the converter writes none
    # llama-quantize's Q4_K_M (llama-quant.cpp): ffn_down_exps / ffn_down_shexp are ffn_down tensors,
    # Q6_K where use_more_bits(layer, 4) (layers 2, 3); attn_qkv / attn_v likewise; the router and the
    # shared expert's gate row (1-D to ggml) are never quantized; the untied embedding is the base type
    more_bits = {"ffn_down_exps", "ffn_down_shexp", "attn_qkv", "attn_v"}
    floats = {"ffn_gate_inp", "ffn_gate_inp_shexp", "ssm_a", "ssm_dt", "ssm_conv1d"}
    for tensor in reader.tensors:
        kind, layer = kind_and_layer(tensor.name)
        if kind.endswith("norm") or kind in floats:
            want = "F32"
        elif kind == "output":
            want = "Q6_K"
        else:
            want = "Q6_K" if kind in more_bits and layer in (2, 3) else "Q4_K"
        assert tensor.tensor_type.name == want, tensor.name


def test_gufo_runs_the_file_and_prefill_matches_decode(synth_file):
    engine = Engine(synth_file, context=64)
    assert engine.model.recurrent_layers == (0, 1, 2)
    assert (engine.model.moe_shape.n_experts, engine.model.moe_shape.n_used) == (16, 4)
    assert torch.isfinite(engine.prefill([1, 2, 3, 4])).all()
    result = validate_prefill(engine, 32)
    assert result.passed, result.lines()


@pytest.mark.gpu
def test_gpu_prefill_matches_the_cpu_engine_and_its_own_decode(synth_file):
    """The GPU's grouped expert products (Q4_K gate/up, Q4_K and Q6_K down) against the CPU engine's one
    product per expert, and GPU decode (gathered experts) against GPU prefill."""
    from gufo.options import RunOptions
    from gufo.tools.quality.logit_diff import compare_logits

    tokens = list(range(100, 164))  # 256 assignments over 16 experts: tiles of 16 rows
    cpu = Engine(synth_file, context=128).prefill(tokens, all_logits=True)
    gpu_engine = Engine(synth_file, options=RunOptions(device="cuda"), context=128)
    gpu = gpu_engine.prefill(tokens, all_logits=True)
    for position in (0, 31, 63):
        diff = compare_logits(cpu[position], gpu[position])
        assert diff.finite and diff.cosine > 0.99, (position, diff)  # int8 CPU activations, float16 GPU
    result = validate_prefill(Engine(synth_file, options=RunOptions(device="cuda"), context=128), 64)
    assert result.passed, result.lines()


def test_mtp_file_runs_speculative_mtp_as_plain_greedy(tmp_path, capsys):
    """`--mtp` writes the multi-token-prediction block (nextn.eh_proj at the base type, its norms float)
    and `--speculative mtp` on the file prints plain greedy decoding's tokens."""
    out = tmp_path / "tiny-mtp.gguf"
    assert main(["synth", "--arch", "qwen35moe", "--preset", "tiny", "--mtp", "-o", str(out)]) == 0
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    assert types[f"blk.{LAYERS}.nextn.eh_proj.weight"] == "Q4_K"
    assert {types[f"blk.{LAYERS}.nextn.{n}.weight"] for n in ("enorm", "hnorm", "shared_head_norm")} == {
        "F32"
    }
    capsys.readouterr()
    run = [
        "run",
        "-m",
        str(out),
        "-p",
        "one two three",
        "-n",
        "6",
        "--temp",
        "0",
        "--ignore-eos",
        "--verbose",
    ]
    outputs = []
    for extra in ([], ["--speculative", "mtp", "--draft-max", "2"]):
        assert main(run + extra) == 0
        captured = capsys.readouterr()
        outputs.append((captured.out, re.search(r"\[TokenTrace\]: .*", captured.err)[0]))
    assert outputs[0] == outputs[1]
    assert re.search(r"\[Speculative\]: drafted=[1-9]", captured.err), captured.err

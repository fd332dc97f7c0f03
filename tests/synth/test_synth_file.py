"""`gufo synth` files: read back by the `gguf` package and by gufo, shapes from the HF configs, real
vocabulary, sane weights, loadable by gufo's Engine; bad input gives one line and exit code 2."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFValueType
from gguf.quants import dequantize

from gufo.cli.main import main
from gufo.engine.engine import Engine
from gufo.errors import BadInputError
from gufo.gguf.model_file import open_model_file
from gufo.tools.synth.presets import find_preset
from gufo.tools.synth.type_mix import find_mix, tensor_type
from gufo.tools.synth.writer import plan_qwen3, write_synth

# Qwen/Qwen3-*/config.json: hidden_size, num_hidden_layers, intermediate_size, num_attention_heads,
# num_key_value_heads, tie_word_embeddings (all: head_dim 128, rope_theta 1e6, rms_norm_eps 1e-6,
# max_position_embeddings 40960).
HF_CONFIGS = {
    "0.6b": (1024, 28, 3072, 16, 8, True),
    "1.7b": (2048, 28, 6144, 16, 8, True),
    "4b": (2560, 36, 9728, 32, 8, True),
    "8b": (4096, 36, 12288, 32, 8, False),
    "14b": (5120, 40, 17408, 40, 8, False),
    "32b": (5120, 64, 25600, 64, 8, False),
}
HEAD_DIM = 128
LAYERS = 2


def expected_dims(preset: str, n_vocab: int, n_layers: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> GGUF dims (ne0 = columns first), from the HF config numbers."""
    hidden, _, ffn, heads, kv, tied = HF_CONFIGS[preset]
    dims = {"token_embd.weight": (hidden, n_vocab), "output_norm.weight": (hidden,)}
    if not tied:
        dims["output.weight"] = (hidden, n_vocab)
    for i in range(n_layers):
        dims |= {
            f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.attn_q.weight": (hidden, heads * HEAD_DIM),
            f"blk.{i}.attn_k.weight": (hidden, kv * HEAD_DIM),
            f"blk.{i}.attn_v.weight": (hidden, kv * HEAD_DIM),
            f"blk.{i}.attn_output.weight": (heads * HEAD_DIM, hidden),
            f"blk.{i}.attn_q_norm.weight": (HEAD_DIM,),
            f"blk.{i}.attn_k_norm.weight": (HEAD_DIM,),
            f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.ffn_gate.weight": (hidden, ffn),
            f"blk.{i}.ffn_up.weight": (hidden, ffn),
            f"blk.{i}.ffn_down.weight": (ffn, hidden),
        }
    return dims


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "qwen3-0.6b-q4_k_m.gguf"
    args = ["synth", "--preset", "0.6b", "--qtype", "Q4_K_M", "--layers", str(LAYERS), "-o", str(out)]
    assert main(args) == 0
    return out


@pytest.mark.parametrize("preset", sorted(HF_CONFIGS))
def test_every_preset_plans_the_hf_shapes(vocab, preset):
    n_vocab = len(vocab.metadata["tokenizer.ggml.tokens"])
    plan = plan_qwen3(preset, find_preset("qwen3", preset), find_mix("Q4_K_M"), vocab)
    planned = {t.name: tuple(reversed(t.shape)) for t in plan.tensors}
    assert planned == expected_dims(preset, n_vocab, HF_CONFIGS[preset][1])


def test_file_reads_back_with_hf_shapes_and_qwen3_metadata(reader):
    hidden, _, ffn, heads, kv, _ = HF_CONFIGS["0.6b"]
    n_vocab = len(reader.get_field("tokenizer.ggml.tokens").contents())
    assert n_vocab == 49152
    assert {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors} == expected_dims(
        "0.6b", n_vocab, LAYERS
    )
    meta = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert meta["general.architecture"] == "qwen3"
    assert "synthetic random weights" in meta["general.name"]
    assert meta["general.file_type"] == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    expected = {
        "block_count": LAYERS,
        "context_length": 40960,
        "embedding_length": hidden,
        "feed_forward_length": ffn,
        "attention.head_count": heads,
        "attention.head_count_kv": kv,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "rope.freq_base": pytest.approx(1e6),
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-6),
    }
    assert {key: meta[f"qwen3.{key}"] for key in expected} == expected


def test_tokenizer_metadata_equals_the_vocab_models(reader, vocab):
    copied = {key: field for key, field in reader.fields.items() if key.startswith("tokenizer.")}
    source = {key for key in vocab.metadata if key.startswith("tokenizer.")}
    assert set(copied) == source and "tokenizer.chat_template" in source
    for key, field in copied.items():
        assert field.contents() == vocab.metadata[key], key
        assert field.types[0] == vocab.value_types[key], key
        if field.types[0] == GGUFValueType.ARRAY:
            assert field.types[-1] == vocab.item_types[key], key


def test_types_follow_the_llama_quantize_rules(reader):
    shape, mix = find_preset("qwen3", "0.6b").with_layers(LAYERS), find_mix("Q4_K_M")
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        kind, layer = (parts[2], int(parts[1])) if parts[0] == "blk" else (parts[0], -1)
        assert tensor.tensor_type == tensor_type(mix, kind, layer, shape), tensor.name
    assert {t.tensor_type.name for t in reader.tensors} == {"F32", "Q4_K", "Q6_K"}  # Q6_K: tied embedding


def test_weights_dequantize_to_finite_values_of_realistic_size(reader):
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type)
        assert np.isfinite(values).all(), tensor.name
        if len(tensor.shape) == 1:
            assert (values == 1.0).all(), tensor.name  # norm weights
        else:
            assert 0.018 < values.std() < 0.022, tensor.name


def test_gufo_reads_the_file_and_runs_it(synth_file, reader):
    mf = open_model_file(synth_file)
    assert mf.architecture == "qwen3"
    assert set(mf.tensors) == {t.name for t in reader.tensors}
    engine = Engine(synth_file, context=32)
    logits = engine.prefill([1, 2, 3, 4])
    assert logits.shape == (49152,) and torch.isfinite(logits).all()
    assert torch.isfinite(engine.decode(5, 4)).all()


def test_an_iq_mix_is_written_as_its_rules_say(tmp_path):
    """IQ2_M on one layer: IQ2_S matrices, IQ3_S for attn_v and attn_output, Q5_K for the tied
    embedding (llama.cpp's rules, checked against llama-quantize in test_type_mix.py). The blocks
    themselves: tests/synth/test_random_blocks.py; models of these formats run in
    tests/formats/test_quant_models.py."""
    out = tmp_path / "iq2_m.gguf"
    assert main(["synth", "--preset", "0.6b", "--qtype", "IQ2_M", "--layers", "1", "-o", str(out)]) == 0
    shape, mix = find_preset("qwen3", "0.6b").with_layers(1), find_mix("IQ2_M")
    tensors = open_model_file(out).tensors.values()
    for tensor in tensors:
        parts = tensor.name.split(".")
        kind, layer = (parts[2], int(parts[1])) if parts[0] == "blk" else (parts[0], -1)
        assert tensor.qtype == tensor_type(mix, kind, layer, shape), tensor.name
    assert {t.qtype.name for t in tensors} == {"F32", "IQ2_S", "IQ3_S", "Q5_K"}


def test_same_seed_same_file_and_force_overwrites(tmp_path, capsys):
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    common = ["synth", "--preset", "0.6b", "--qtype", "q4_0", "--layers", "1", "--seed", "3"]
    assert main([*common, "-o", str(first)]) == 0
    second.write_bytes(b"old")
    assert main([*common, "-o", str(second), "--force"]) == 0
    assert first.read_bytes() == second.read_bytes()
    umask = os.umask(0)
    os.umask(umask)
    assert first.stat().st_mode & 0o777 == 0o666 & ~umask  # a plain file's mode, not a temp file's 0600
    assert "Q4_0, 1 layers" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf"]  # no temporary left


def test_interrupted_write_leaves_no_file(tmp_path, vocab):
    plan = plan_qwen3("0.6b", find_preset("qwen3", "0.6b").with_layers(1), find_mix("Q8_0"), vocab)

    def interrupt(_: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_synth(plan, tmp_path / "x.gguf", progress=interrupt)
    assert list(tmp_path.iterdir()) == []


def test_vocab_without_tokens_is_bad_input(tmp_path):
    from gguf import GGUFWriter

    empty = tmp_path / "empty.gguf"
    writer = GGUFWriter(empty, "qwen3")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(BadInputError, match="has no vocabulary"):
        plan_qwen3("0.6b", find_preset("qwen3", "0.6b"), find_mix("Q8_0"), open_model_file(empty))


def unwritable_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root writes through file modes; sysfs refuses new files even to root
        return Path("/sys")
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    return folder


@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--preset", "3b"], "--preset 3b: unknown qwen3 preset"),
        (["--preset", "0.6b", "--qtype", "Q7_K"], "--qtype Q7_K: unknown"),
        (["--preset", "0.6b", "--qtype", "MXFP4_MOE"], "does not generate"),
        (["--preset", "0.6b", "--arch", "llama"], "--arch llama: unknown architecture"),
        (["--preset", "0.6b", "--vocab-from", "no-such.gguf"], "no-such.gguf"),
    ],
)
def test_bad_flags_give_one_line_and_exit_2(tmp_path, capsys, flags, fragment):
    code = main(["synth", *flags, "-o", str(tmp_path / "x.gguf")])
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_bad_outputs_give_one_line_and_exit_2(tmp_path, capsys):
    existing = tmp_path / "there.gguf"
    existing.write_bytes(b"keep")
    a_file = tmp_path / "plain"
    a_file.write_text("")
    cases = [
        (existing, "already exists (use --force"),
        (tmp_path / "missing" / "x.gguf", "does not exist"),
        (a_file / "x.gguf", "does not exist"),
        (tmp_path, "is a directory"),
        (unwritable_dir(tmp_path) / "x.gguf", "cannot write in"),
    ]
    for out, fragment in cases:
        code = main(["synth", "--preset", "0.6b", "--layers", "1", "-o", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, out
    assert existing.read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain", "there.gguf"]

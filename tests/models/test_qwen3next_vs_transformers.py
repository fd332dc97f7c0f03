"""A tiny random Qwen3-Next (hybrid mixers + mixture of experts) written to GGUF in llama.cpp's converter
layout must match transformers' Qwen3NextForCausalLM: every position's logits, through gufo's prefill and
through one-token decode steps; --validate-prefill passes with chunks that do not divide the prompt."""

from __future__ import annotations

import gguf
import pytest
from gguf_rewrite import rewrite
from qwen35_gguf import tiny_hf_model, write_gguf
from test_qwen35_vs_transformers import SEQ, check_prefill_and_decode

from gufo.engine.engine import Engine
from gufo.errors import BadInputError
from gufo.kernels.catalog import register_all
from gufo.models.registry import build_model
from gufo.tools.quality.validate_prefill import validate_prefill

pytest.importorskip("transformers")

ARCH = "qwen3next"


@pytest.fixture(autouse=True)
def cpu_kernels():
    register_all("cpu")


@pytest.mark.parametrize(
    "interval,matrix_type",
    [(2, gguf.GGMLQuantizationType.F32), (4, gguf.GGMLQuantizationType.F16)],
    ids=["interval2-f32", "interval4-f16"],
)
def test_tiny_qwen3next_matches_transformers(tmp_path, interval, matrix_type):
    check_prefill_and_decode(tmp_path, interval, matrix_type, ARCH)


@pytest.mark.parametrize("batch_size", [40, 7])  # 40 + 40 + 16; 13 x 7 + 5
def test_validate_prefill_in_uneven_chunks(tmp_path, batch_size):
    path = write_gguf(tiny_hf_model(2, arch=ARCH), tmp_path / "tiny.gguf")
    result = validate_prefill(Engine(path, context=SEQ, batch_size=batch_size), SEQ)
    assert result.passed, result.lines()
    assert result.diff.max_abs_diff < 1e-3


@pytest.mark.parametrize(
    "drop_key,drop_tensor,message",
    [
        ("qwen3next.expert_used_count", None, "metadata key 'qwen3next.expert_used_count' is missing"),
        (None, "blk.0.ffn_up_exps.weight", "required tensor 'blk.0.ffn_up_exps.weight' is missing"),
        (None, "blk.1.ffn_gate_inp_shexp.weight", "tensor 'blk.1.ffn_gate_inp_shexp.weight' is missing"),
    ],
)
def test_missing_key_or_tensor_is_one_clear_error(tmp_path, drop_key, drop_tensor, message):
    path = write_gguf(tiny_hf_model(2, arch=ARCH), tmp_path / "tiny.gguf")
    mf = rewrite(path, tmp_path / "broken.gguf", drop_key, drop_tensor)
    with pytest.raises(BadInputError, match=message):
        build_model(mf, "cpu")

"""A tiny random Qwen3.5-MoE written to GGUF in llama.cpp's converter layout (tests/models/qwen35_gguf.py:
a toy vocabulary, so the file is cheap to rewrite) must match transformers' Qwen3_5MoeForCausalLM with
float16 matrices, through prefill and one-token decode steps (the float32 file of llama.cpp's own converter:
test_converted_vs_transformers.py); what it does not implement is refused by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_rewrite import rewrite
from qwen35_gguf import tiny_hf_model, write_gguf
from test_qwen35_vs_transformers import check_prefill_and_decode

from gufo.errors import BadInputError
from gufo.kernels.catalog import register_all
from gufo.models.registry import build_model

pytest.importorskip("transformers")

ARCH = "qwen35moe"


@pytest.fixture(autouse=True)
def cpu_kernels():
    register_all("cpu")


def test_tiny_qwen35moe_with_float16_matrices_matches_transformers(tmp_path):
    check_prefill_and_decode(tmp_path, 4, gguf.GGMLQuantizationType.F16, ARCH)


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return write_gguf(tiny_hf_model(2, arch=ARCH), tmp_path_factory.mktemp(ARCH) / "tiny.gguf")


@pytest.mark.parametrize(
    "drop_key,drop_tensor,message",
    [
        ("qwen35moe.expert_count", None, "metadata key 'qwen35moe.expert_count' is missing"),
        # every block routes (llama.cpp requires the router): no dense FFN in its place
        (None, "blk.1.ffn_gate_inp.weight", "required tensor 'blk.1.ffn_gate_inp.weight' is missing"),
        (None, "blk.0.ffn_down_exps.weight", "required tensor 'blk.0.ffn_down_exps.weight' is missing"),
    ],
)
def test_missing_key_or_tensor_is_one_clear_error(tiny_file, tmp_path, drop_key, drop_tensor, message):
    mf = rewrite(tiny_file, tmp_path / "broken.gguf", drop_key, drop_tensor)
    with pytest.raises(BadInputError, match=message):
        build_model(mf, "cpu")


@pytest.mark.parametrize("key", ["expert_weights_scale", "expert_gating_func", "expert_group_count"])
def test_an_unimplemented_expert_key_is_refused_by_name(tiny_file, tmp_path, key):
    """llama.cpp's qwen35moe loader reads none of these; a file that sets one means other math."""
    extra = {f"{ARCH}.{key}": (2, gguf.GGUFValueType.UINT32)}
    mf = rewrite(tiny_file, tmp_path / "extra.gguf", keys=extra)
    with pytest.raises(BadInputError, match=f"metadata key {ARCH}.{key} = 2 is not implemented"):
        build_model(mf, "cpu")


def test_an_unused_expert_tensor_is_refused_by_name(tiny_file, tmp_path):
    """Expert biases (gpt-oss has them) would change the logits."""
    extra = {"blk.0.ffn_down_exps.bias": np.ones((8, 64), dtype=np.float32)}
    mf = rewrite(tiny_file, tmp_path / "extra.gguf", tensors=extra)
    with pytest.raises(BadInputError, match=r"tensor blk\.0\.ffn_down_exps\.bias is not used"):
        build_model(mf, "cpu")

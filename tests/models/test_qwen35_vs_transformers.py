"""A tiny random Qwen3.5 written to GGUF in llama.cpp's converter layout must match transformers'
Qwen3_5ForCausalLM: every position's logits, through gufo's prefill and through one-token decode steps."""

from __future__ import annotations

import gguf
import pytest
import torch
from gguf_rewrite import rewrite
from qwen35_gguf import VOCAB, tiny_hf_model, write_gguf

from gufo.errors import BadInputError
from gufo.gguf.model_file import open_model_file
from gufo.kernels.catalog import register_all
from gufo.models.registry import build_model

pytest.importorskip("transformers")

SEQ = 96  # more than one 64-token chunk of the delta rule, and not a multiple of it
TOLERANCE = 1e-3


@pytest.fixture(autouse=True)
def cpu_kernels():
    register_all("cpu")


def expected_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens[None]).logits[0].float()


def check(ours: torch.Tensor, expected: torch.Tensor) -> float:
    diff = float((ours - expected).abs().max())
    assert ours.shape == expected.shape
    assert diff <= TOLERANCE
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))
    return diff


@pytest.mark.parametrize(
    "interval,matrix_type",
    [
        (4, gguf.GGMLQuantizationType.F32),
        (2, gguf.GGMLQuantizationType.F32),
        (4, gguf.GGMLQuantizationType.F16),
    ],
    ids=["interval4-f32", "interval2-f32", "interval4-f16"],
)
def test_tiny_qwen35_matches_transformers(tmp_path, interval, matrix_type):
    check_prefill_and_decode(tmp_path, interval, matrix_type, "qwen35")


def check_prefill_and_decode(tmp_path, interval: int, matrix_type, arch: str) -> None:
    """A tiny random transformers model of `arch` against gufo on its GGUF: prefill and decode steps."""
    hf = tiny_hf_model(interval, arch=arch)
    path = write_gguf(hf, tmp_path / f"tiny-{arch}.gguf", matrix_type)
    tokens = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(1))
    expected = expected_logits(hf, tokens)
    model = build_model(open_model_file(path), "cpu")
    cache = model.new_cache(1, SEQ)
    with torch.inference_mode():
        prefill = model.forward(tokens, cache, 0, 0, all_logits=True)
        decode = torch.cat([model.forward(tokens[i : i + 1], cache, 0, i) for i in range(SEQ)])
    check(prefill, expected)
    check(decode, expected)


def test_prefill_in_pieces_continues_the_recurrent_state(tmp_path):
    """Chunks of 40 + 50 + 6 tokens (not multiples of the conv or delta-rule chunk) equal one pass."""
    hf = tiny_hf_model(2)
    model = build_model(open_model_file(write_gguf(hf, tmp_path / "tiny.gguf")), "cpu")
    tokens = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(2))
    cache = model.new_cache(1, SEQ)
    with torch.inference_mode():
        parts = [
            model.forward(tokens[a:b], cache, 0, a, all_logits=True) for a, b in ((0, 40), (40, 90), (90, 96))
        ]
    check(torch.cat(parts), expected_logits(hf, tokens))


@pytest.mark.parametrize(
    "drop_key,drop_tensor,message",
    [
        ("qwen35.ssm.state_size", None, "required metadata key 'qwen35.ssm.state_size' is missing"),
        (None, "blk.0.ssm_a", "required tensor 'blk.0.ssm_a' is missing"),
    ],
)
def test_missing_key_or_tensor_is_one_clear_error(tmp_path, drop_key, drop_tensor, message):
    path = write_gguf(tiny_hf_model(4), tmp_path / "tiny.gguf")
    mf = rewrite(path, tmp_path / "broken.gguf", drop_key, drop_tensor)
    with pytest.raises(BadInputError, match=message):
        build_model(mf, "cpu")

"""Shard rules on the real models' GGUF tensors: every shard dequantizes (by the gguf package, an
independent dequantizer) to the matching slice of the whole tensor, and impossible splits are refused."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from gufo.errors import BadInputError
from gufo.gguf.aliases import resolve_model
from gufo.gguf.model_file import open_model_file
from gufo.models.base import ModelConfig
from gufo.parallel.sharding import COLUMNS, ROWS, ShardedModelFile, Split, plan_layout, shard
from tests.engine.tiny_model import write_tiny_model


def dequantized(info) -> np.ndarray:
    return gguf.quants.dequantize(np.asarray(info.data), info.qtype).reshape(info.shape)


@pytest.fixture(scope="module")
def smollm2():
    return open_model_file(resolve_model("smollm2-135m"))


@pytest.fixture(scope="module")
def gemma3():
    return open_model_file(resolve_model("gemma3-270m"))


@pytest.mark.parametrize(
    "alias,name,world",
    [
        ("smollm2-135m", "blk.0.attn_output.weight", 3),  # Q4_1, 32-column blocks
        ("smollm2-135m", "blk.0.ffn_down.weight", 3),
        ("gemma3-270m", "blk.0.ffn_down.weight", 4),  # Q4_K, 256-column super-blocks
        ("gemma3-270m", "blk.5.ffn_down.weight", 2),  # Q6_K
        ("gemma3-270m", "blk.0.attn_q.weight", 4),  # Q5_0 rows
    ],
)
def test_shards_are_slices_of_the_dequantized_tensor(alias, name, world):
    info = open_model_file(resolve_model(alias)).tensor(name)
    whole = dequantized(info)
    axis = COLUMNS if "output" in name or "down" in name else ROWS
    size = info.shape[axis] // world
    parts = [dequantized(shard(info, Split(axis, size), rank)) for rank in range(world)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=axis), whole)


def test_smollm2_splits_three_ways_by_kv_head(smollm2):
    layout = plan_layout(smollm2, 3)
    cfg = ModelConfig.from_file(ShardedModelFile(smollm2, layout, rank=2))
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.key_dim, cfg.n_ff, cfg.vocab_size) == (3, 1, 64, 512, 49152)
    view = ShardedModelFile(smollm2, layout, rank=2)
    # tied output: the rank's vocabulary rows of the (replicated) embedding
    assert view.tensor("output.weight").shape == (16384, 576)
    assert view.tensor("token_embd.weight").shape == (49152, 576)
    assert view.tensor("blk.3.attn_k.weight").shape == (64, 576)
    assert view.tensor("blk.3.attn_output.weight").shape == (576, 192)


def test_smollm2_refuses_two_ranks(smollm2):
    with pytest.raises(BadInputError) as err:
        plan_layout(smollm2, 2)
    assert str(err.value) == (
        "SmolLM2-135M-Instruct.Q4_1.gguf: --tensor-parallel 2 cannot split 3 KV heads (9 query heads, 3 per "
        "KV head) into 2 equal groups; degrees that split it: 3"
    )


@pytest.mark.parametrize("world", [2, 4])
def test_gemma3_replicates_its_single_kv_head(gemma3, world):
    """4 query heads over 1 KV head: each rank takes 4 / world query heads and the whole KV head."""
    layout = plan_layout(gemma3, world)
    k_full = dequantized(gemma3.tensor("blk.0.attn_k.weight"))
    q_full = dequantized(gemma3.tensor("blk.0.attn_q.weight"))
    q_parts = []
    for rank in range(world):
        view = ShardedModelFile(gemma3, layout, rank)
        cfg = ModelConfig.from_file(view)
        assert (cfg.n_heads, cfg.n_kv_heads, cfg.key_dim, cfg.n_ff) == (4 // world, 1, 256, 2048 // world)
        np.testing.assert_array_equal(dequantized(view.tensor("blk.0.attn_k.weight")), k_full)
        q_parts.append(dequantized(view.tensor("blk.0.attn_q.weight")))
    np.testing.assert_array_equal(np.concatenate(q_parts), q_full)


def test_gemma3_refuses_three_ranks(gemma3):
    expected = r"cannot split 1 KV head \(4 query heads.*degrees that split it: 2, 4$"
    with pytest.raises(BadInputError, match=expected):
        plan_layout(gemma3, 3)


def test_column_split_that_cuts_a_block_is_refused(tmp_path):
    # 192 FFN columns: 96 per rank over 2 ranks (3 Q8_0 blocks of 32), 48 over 4 ranks (cuts a block)
    mf = open_model_file(write_tiny_model(tmp_path / "tiny.gguf", "qwen3", n_heads=8, n_kv_heads=4, n_ff=192))
    plan_layout(mf, 2)
    cut = "would cut Q8_0 blocks of blk.0.ffn_down.weight: each rank takes 48 of its 192 input columns"
    with pytest.raises(BadInputError, match=cut):
        plan_layout(mf, 4)


def test_unsupported_architecture_is_refused(tmp_path, monkeypatch):
    mf = open_model_file(write_tiny_model(tmp_path / "tiny.gguf", "llama"))
    monkeypatch.setitem(mf.metadata, "general.architecture", "mamba")
    with pytest.raises(BadInputError, match="supports the llama, qwen3, gemma3 architectures, not mamba"):
        plan_layout(mf, 2)

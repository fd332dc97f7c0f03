"""The fused CPU decode layer against the model's torch layer (the reference) on tiny random models of odd
shapes."""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch

from gufo.kernels.catalog import register_all
from gufo.kernels.decode import CpuDecodeLayer
from gufo.models.kv_cache import KVCache

pytestmark = pytest.mark.skipif(not CpuDecodeLayer.available(), reason="needs AVX2 and a C compiler")

Q = gguf.GGMLQuantizationType
N_EMBD, N_FF, N_LAYERS, CONTEXT = 64, 96, 3, 24

# (architecture, head dims, qtypes per weight, extra metadata). Mixed qtypes split q/k/v and gate/up
# into several products, including a split whose rows are not in q, k, v order ([q, v] then [k]).
CASES = {
    "llama-partial-rope": (
        "llama",
        dict(n_heads=8, n_kv=2, head_dim=12),  # head_dim 12: the attention dot's scalar tail
        {"attn_q": Q.Q4_1, "attn_k": Q.Q4_1, "attn_v": Q.Q4_1, "attn_output": Q.Q4_1, "ffn_gate": Q.Q4_1},
        {"rope.dimension_count": 8},
    ),
    "qwen3-mixed": (
        "qwen3",
        dict(n_heads=4, n_kv=2, head_dim=24),
        {"attn_q": Q.Q8_0, "attn_k": Q.Q4_0, "attn_v": Q.Q8_0, "attn_output": Q.Q5_1, "ffn_up": Q.Q5_0},
        {},
    ),
    "gemma3-window": (
        "gemma3",
        dict(n_heads=4, n_kv=1, head_dim=32),
        {"attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "ffn_down": Q.Q8_0, "ffn_gate": Q.Q4_0},
        {"attention.sliding_window": 5, "attention.sliding_window_pattern": 2},
    ),
}


def write_model(path, arch: str, heads: dict, qtypes: dict, extra: dict) -> None:
    rng = np.random.default_rng(len(path.name))
    n_heads, n_kv, head_dim = heads["n_heads"], heads["n_kv"], heads["head_dim"]
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {
        "block_count": N_LAYERS,
        "context_length": 128,
        "embedding_length": N_EMBD,
        "feed_forward_length": N_FF,
        "attention.head_count": n_heads,
        "attention.head_count_kv": n_kv,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "vocab_size": 32,
        **extra,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    shapes = {
        "attn_q": (n_heads * head_dim, N_EMBD),
        "attn_k": (n_kv * head_dim, N_EMBD),
        "attn_v": (n_kv * head_dim, N_EMBD),
        "attn_output": (N_EMBD, n_heads * head_dim),
        "ffn_gate": (N_FF, N_EMBD),
        "ffn_up": (N_FF, N_EMBD),
        "ffn_down": (N_EMBD, N_FF),
    }
    norms = {"attn_norm": N_EMBD, "ffn_norm": N_EMBD}
    if arch != "llama":
        norms |= {"attn_q_norm": head_dim, "attn_k_norm": head_dim}
    if arch == "gemma3":
        norms |= {"post_attention_norm": N_EMBD, "post_ffw_norm": N_EMBD}
    writer.add_tensor("token_embd.weight", rng.standard_normal((32, N_EMBD)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    for i in range(N_LAYERS):
        for name, shape in shapes.items():
            data = (rng.standard_normal(shape) * 0.3).astype(np.float32)
            qtype = qtypes.get(name, Q.Q8_0)
            writer.add_tensor(f"blk.{i}.{name}.weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        for name, size in norms.items():
            writer.add_tensor(
                f"blk.{i}.{name}.weight", (1 + 0.3 * rng.standard_normal(size)).astype(np.float32)
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def build(tmp_path, case: str, qtypes: dict | None = None):
    from gufo.gguf.model_file import open_model_file
    from gufo.models.registry import build_model

    register_all("cpu")

    arch, heads, case_qtypes, extra = CASES[case]
    path = tmp_path / f"{case}.gguf"
    write_model(path, arch, heads, case_qtypes if qtypes is None else qtypes, extra)
    return build_model(open_model_file(path), "cpu")


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_layer_matches_torch_layer(tmp_path, case):
    """Positions 0..CONTEXT-1 one at a time in slot 1 of 2: every layer's output and the cache it wrote
    must match the torch layer fed the same input (windowed and global layers, GQA, partial RoPE), its
    slot's pages in reverse order against the torch layer's in order."""
    model = build(tmp_path, case)
    cfg = model.config
    fused = CpuDecodeLayer.prepare([layer.spec() for layer in model.layers])
    assert fused is not None and model.decode_route.name == "cpu:cpu-fused-layer"
    caches = [
        KVCache(cfg.n_layers, 2, cfg.n_kv_heads, CONTEXT, cfg.key_dim, cfg.value_dim, page_size=4)
        for _ in range(2)
    ]
    for cache in caches:
        cache.reserve(1, 0, CONTEXT)
    held = caches[1].held[1]
    held.reverse()  # the fused layer's slot holds its pages in reverse order: it must follow the table
    caches[1].table[1, : len(held)] = torch.tensor(held)
    gen = torch.Generator().manual_seed(7)
    for pos in range(CONTEXT):
        x = torch.randn(1, cfg.n_embd, generator=gen) * 2
        tables = {rope: rope.tables(torch.tensor([pos])) for rope in model.ropes}
        for index, layer in enumerate(model.layers):
            rope_tables = tables[layer.attn.rope]
            want = layer(x, rope_tables, caches[0], index, 1, pos)
            got = CpuDecodeLayer.apply(fused, index, x, rope_tables, caches[1], 1, pos)
            assert got.shape == want.shape
            # Same int8 products and norms; only attention's summation order differs (seen: ~1e-6)
            assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max()), (pos, index)
            x = want
    for layer in range(cfg.n_layers):
        written = zip(caches[0].entries(layer, 1, CONTEXT), caches[1].entries(layer, 1, CONTEXT), strict=True)
        for want, got in written:
            assert float((want - got).abs().max()) < 1e-4 * float(want.abs().max())


def test_float_weights_are_refused(tmp_path):
    """A product the int8 kernel does not run (F32 here): the kernel declines the layers (the model then
    keeps decode on its torch layers)."""
    model = build(tmp_path, "llama-partial-rope", {"attn_output": Q.F32})
    assert CpuDecodeLayer.prepare([layer.spec() for layer in model.layers]) is None
    assert model.decode_route.name == "torch:torch-layer" and not model.decode_route.batch_invariant


@pytest.mark.parametrize("refused", ["bias", "collective", "route", "activation"])
def test_layers_the_kernel_cannot_run_are_refused(tmp_path, refused):
    """A bias, a collective after a product, a product routed elsewhere, an unknown activation: None."""
    model = build(tmp_path, "qwen3-mixed")
    specs = [layer.spec() for layer in model.layers]
    down = specs[-1].down
    changed = {
        "bias": {"down": dataclasses.replace(down, has_bias=True)},
        "collective": {"down": dataclasses.replace(down, has_collective=True)},
        "route": {"down": dataclasses.replace(down, route="torch")},
        "activation": {"activation": "relu"},
    }[refused]
    assert CpuDecodeLayer.prepare(specs) is not None
    assert CpuDecodeLayer.prepare([*specs[:-1], dataclasses.replace(specs[-1], **changed)]) is None

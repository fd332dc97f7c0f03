"""Tiny random llama / gemma3 GGUFs with a 32-token SentencePiece-style vocabulary, loadable by `Engine`."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from gufo.formats.random_blocks import random_blocks

VOCAB = 32
N_EMBD, N_FF, N_LAYERS, N_HEADS, HEAD_DIM = 64, 128, 2, 4, 16


def write_tiny_model(
    path: Path,
    arch: str = "llama",
    seed: int = 0,
    n_heads: int = N_HEADS,
    n_kv_heads: int = N_HEADS // 2,
    n_ff: int = N_FF,
    n_embd: int = N_EMBD,
    head_dim: int = HEAD_DIM,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q8_0,
    dequantized: bool = False,
    layer_std: float = 0.3,
) -> Path:
    """Q8_0 matrices (so the fused CPU decode layer runs), norms of 1. gemma3 gets sliding-window
    attention of 5 positions on every other layer; gemma3 and qwen3 get QK norms.

    Another `qtype` gets random valid blocks of that format (gufo.formats.random_blocks) of the same
    deviations; `dequantized` writes the same model (same seed, same blocks) with every matrix
    dequantized by the `gguf` package and stored as F32: the float twin of the quantized file.
    `layer_std`: the deviation of the layers' weights."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    window = {}
    if arch == "gemma3":
        window = {"attention.sliding_window": 5, "attention.sliding_window_pattern": 2}
    for key, value in {
        "block_count": N_LAYERS,
        "context_length": 256,
        "embedding_length": n_embd,
        "feed_forward_length": n_ff,
        "attention.head_count": n_heads,
        "attention.head_count_kv": n_kv_heads,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "vocab_size": VOCAB,
        **window,
    }.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{arch}.rope.freq_base", 10000.0)
    writer.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>", *[f"t{i}" for i in range(VOCAB - 3)]]
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * VOCAB)
    writer.add_token_types([2, 3, 3, *[1] * (VOCAB - 3)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)

    def add_matrix(name: str, rows: int, cols: int, scale: float) -> None:
        if qtype == gguf.GGMLQuantizationType.Q8_0:
            data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
            blocks = gguf.quants.quantize(data, qtype)
        else:
            block_elems, _ = gguf.GGML_QUANT_SIZES[qtype]
            blocks = random_blocks(qtype, rows * cols // block_elems, rng, std=scale).reshape(rows, -1)
        if dequantized:
            writer.add_tensor(name, gguf.quants.dequantize(blocks, qtype))
        else:
            writer.add_tensor(name, blocks, raw_dtype=qtype)

    writer.add_tensor("token_embd.weight", rng.standard_normal((VOCAB, n_embd)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    add_matrix("output.weight", VOCAB, n_embd, 0.15)
    kv = n_kv_heads * head_dim
    shapes = {
        "attn_q": (n_heads * head_dim, n_embd),
        "attn_k": (kv, n_embd),
        "attn_v": (kv, n_embd),
        "attn_output": (n_embd, n_heads * head_dim),
        "ffn_gate": (n_ff, n_embd),
        "ffn_up": (n_ff, n_embd),
        "ffn_down": (n_embd, n_ff),
    }
    for layer in range(N_LAYERS):
        for name, shape in shapes.items():
            add_matrix(f"blk.{layer}.{name}.weight", *shape, layer_std)
        norms = {"attn_norm": n_embd, "ffn_norm": n_embd}
        if arch in ("gemma3", "qwen3"):
            norms |= {"attn_q_norm": head_dim, "attn_k_norm": head_dim}
        if arch == "gemma3":
            norms |= {"post_attention_norm": n_embd, "post_ffw_norm": n_embd}
        for name, size in norms.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", np.ones(size, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

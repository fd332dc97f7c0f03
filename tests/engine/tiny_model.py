"""Tiny random llama / gemma3 GGUFs with a 32-token SentencePiece-style vocabulary, loadable by `Engine`."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VOCAB = 32
N_EMBD, N_FF, N_LAYERS, N_HEADS, HEAD_DIM = 64, 128, 2, 4, 16


def write_tiny_model(
    path: Path,
    arch: str = "llama",
    seed: int = 0,
    n_heads: int = N_HEADS,
    n_kv_heads: int = N_HEADS // 2,
    n_ff: int = N_FF,
) -> Path:
    """Q8_0 matrices (so the fused CPU decode layer runs), norms of 1. gemma3 gets sliding-window
    attention of 5 positions on every other layer; gemma3 and qwen3 get QK norms."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    window = {}
    if arch == "gemma3":
        window = {"attention.sliding_window": 5, "attention.sliding_window_pattern": 2}
    for key, value in {
        "block_count": N_LAYERS,
        "context_length": 256,
        "embedding_length": N_EMBD,
        "feed_forward_length": n_ff,
        "attention.head_count": n_heads,
        "attention.head_count_kv": n_kv_heads,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
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

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)

    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("token_embd.weight", rng.standard_normal((VOCAB, N_EMBD)).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor("output.weight", matrix(VOCAB, N_EMBD, 0.15), raw_dtype=q8)
    kv = n_kv_heads * HEAD_DIM
    shapes = {
        "attn_q": (n_heads * HEAD_DIM, N_EMBD),
        "attn_k": (kv, N_EMBD),
        "attn_v": (kv, N_EMBD),
        "attn_output": (N_EMBD, n_heads * HEAD_DIM),
        "ffn_gate": (n_ff, N_EMBD),
        "ffn_up": (n_ff, N_EMBD),
        "ffn_down": (N_EMBD, n_ff),
    }
    for layer in range(N_LAYERS):
        for name, shape in shapes.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", matrix(*shape, 0.3), raw_dtype=q8)
        norms = {"attn_norm": N_EMBD, "ffn_norm": N_EMBD}
        if arch in ("gemma3", "qwen3"):
            norms |= {"attn_q_norm": HEAD_DIM, "attn_k_norm": HEAD_DIM}
        if arch == "gemma3":
            norms |= {"post_attention_norm": N_EMBD, "post_ffw_norm": N_EMBD}
        for name, size in norms.items():
            writer.add_tensor(f"blk.{layer}.{name}.weight", np.ones(size, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

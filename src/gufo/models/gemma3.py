"""`gemma3` architecture.

Interleaved attention: every `pattern`-th layer is global (RoPE base from the file, optional linear
scaling), the others use a sliding window with their own RoPE base (10000). QK RMSNorm, norms before
and after both attention and FFN, embeddings scaled by sqrt(n_embd), tied output, GeGLU (tanh GELU).
Norm weights in GGUF already include gemma's +1.
"""

from __future__ import annotations

import math

import torch

from gufo.gguf.model_file import ModelFile
from gufo.models.base import DecoderModel, GatedFFN, ModelConfig, SelfAttention
from gufo.models.layers import RMSNorm, Rope, gelu_tanh
from gufo.models.registry import register_architecture
from gufo.runtime.kv_cache import KVCache

LOCAL_ROPE_BASE = 10000.0
DEFAULT_SWA_PATTERN = 6


class Gemma3Layer:
    def __init__(
        self,
        mf: ModelFile,
        index: int,
        cfg: ModelConfig,
        backend: str,
        rope: Rope,
        window: int | None,
        scale: float,
    ):
        prefix = f"blk.{index}"
        self.attn_norm = RMSNorm(mf, f"{prefix}.attn_norm.weight", cfg.rms_eps, backend)
        self.post_attn_norm = RMSNorm(mf, f"{prefix}.post_attention_norm.weight", cfg.rms_eps, backend)
        self.ffn_norm = RMSNorm(mf, f"{prefix}.ffn_norm.weight", cfg.rms_eps, backend)
        self.post_ffn_norm = RMSNorm(mf, f"{prefix}.post_ffw_norm.weight", cfg.rms_eps, backend)
        self.rope = rope
        self.attn = SelfAttention(mf, prefix, cfg, backend, rope, scale, qk_norm=True, window=window)
        self.ffn = GatedFFN(mf, prefix, backend, gelu_tanh)


@register_architecture("gemma3")
class Gemma3Model(DecoderModel):
    def __init__(self, mf: ModelFile, backend: str):
        cfg = ModelConfig.from_file(mf)
        super().__init__(mf, cfg, backend)
        self.embedding_scale = math.sqrt(cfg.n_embd)
        window = int(mf.arch_key("attention.sliding_window", 0)) or None
        pattern = int(mf.arch_key("attention.sliding_window_pattern", DEFAULT_SWA_PATTERN))
        scaling = 1.0
        if mf.arch_key("rope.scaling.type", "none") == "linear":
            scaling = float(mf.arch_key("rope.scaling.factor", 1.0))
        global_rope = Rope(cfg.key_dim, float(mf.arch_key("rope.freq_base", 1_000_000.0)), True, scaling)
        local_rope = Rope(cfg.key_dim, LOCAL_ROPE_BASE, True)
        self.ropes = [global_rope, local_rope]
        scale = 1.0 / math.sqrt(cfg.key_dim)
        self.layers = []
        for i in range(cfg.n_layers):
            is_global = window is None or (i + 1) % pattern == 0
            rope = global_rope if is_global else local_rope
            self.layers.append(Gemma3Layer(mf, i, cfg, backend, rope, None if is_global else window, scale))

    def block(self, index: int, x: torch.Tensor, tables: dict, cache: KVCache, slot: int, start_pos: int):
        layer = self.layers[index]
        h = layer.attn(layer.attn_norm(x), tables[layer.rope], cache, index, slot, start_pos)
        x = x + layer.post_attn_norm(h)
        h = layer.ffn(layer.ffn_norm(x))
        return x + layer.post_ffn_norm(h)

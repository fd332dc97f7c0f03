"""`llama` architecture (SmolLM2, Llama 2/3): pre-norm blocks, GQA, SwiGLU, RoPE on adjacent pairs."""

from __future__ import annotations

import torch

from gufo.gguf.model_file import ModelFile
from gufo.models.base import DecoderModel, GatedFFN, ModelConfig, SelfAttention, silu
from gufo.models.layers import RMSNorm, Rope, default_attention_scale
from gufo.models.registry import register_architecture
from gufo.runtime.kv_cache import KVCache


class LlamaLayer:
    def __init__(self, mf: ModelFile, index: int, cfg: ModelConfig, backend: str, rope: Rope, qk_norm: bool):
        prefix = f"blk.{index}"
        self.attn_norm = RMSNorm(mf, f"{prefix}.attn_norm.weight", cfg.rms_eps, backend)
        self.ffn_norm = RMSNorm(mf, f"{prefix}.ffn_norm.weight", cfg.rms_eps, backend)
        self.attn = SelfAttention(
            mf, prefix, cfg, backend, rope, default_attention_scale(cfg.key_dim), qk_norm=qk_norm
        )
        self.ffn = GatedFFN(mf, prefix, backend, silu)


@register_architecture("llama")
class LlamaModel(DecoderModel):
    rope_neox = False  # the GGUF converter permutes Q/K for GGML's adjacent-pair RoPE
    qk_norm = False

    def __init__(self, mf: ModelFile, backend: str):
        cfg = ModelConfig.from_file(mf)
        super().__init__(mf, cfg, backend)
        rope_dim = int(mf.arch_key("rope.dimension_count", cfg.key_dim))
        scale = 1.0
        if mf.arch_key("rope.scaling.type", "none") == "linear":
            scale = float(mf.arch_key("rope.scaling.factor", 1.0))
        self.rope = Rope(rope_dim, float(mf.arch_key("rope.freq_base", 10000.0)), self.rope_neox, scale)
        self.ropes = [self.rope]
        self.layers = [LlamaLayer(mf, i, cfg, backend, self.rope, self.qk_norm) for i in range(cfg.n_layers)]

    def block(self, index: int, x: torch.Tensor, tables: dict, cache: KVCache, slot: int, start_pos: int):
        layer = self.layers[index]
        x = x + layer.attn(layer.attn_norm(x), tables[self.rope], cache, index, slot, start_pos)
        return x + layer.ffn(layer.ffn_norm(x))

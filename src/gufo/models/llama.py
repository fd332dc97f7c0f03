"""`llama` architecture (SmolLM2, Llama 2/3): pre-norm blocks, GQA, SwiGLU, RoPE on adjacent pairs."""

from __future__ import annotations

from gufo.gguf.model_file import ModelFile
from gufo.models.base import DecoderLayer, DecoderModel, ModelConfig, SelfAttention
from gufo.models.layers import Rope, default_attention_scale
from gufo.models.registry import register_architecture


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
        attn_scale = default_attention_scale(cfg.key_dim)
        self.layers = [
            DecoderLayer(
                mf,
                i,
                cfg,
                backend,
                SelfAttention(mf, f"blk.{i}", cfg, backend, self.rope, attn_scale, qk_norm=self.qk_norm),
                "silu",
                post_norms=False,
            )
            for i in range(cfg.n_layers)
        ]

"""`llama` architecture (SmolLM2, Llama 2/3): pre-norm blocks, GQA, SwiGLU, RoPE on adjacent pairs."""

from __future__ import annotations

from gufo.gguf.model_file import ModelFile
from gufo.models.base import DecoderLayer, DecoderModel, ModelConfig, SelfAttention
from gufo.models.layers import attention_scale
from gufo.models.registry import register_architecture
from gufo.models.rope import rope_from_file


@register_architecture("llama")
class LlamaModel(DecoderModel):
    rope_neox = False  # the GGUF converter permutes Q/K for GGML's adjacent-pair RoPE
    qk_norm = False

    def __init__(self, mf: ModelFile, backend: str):
        cfg = ModelConfig.from_file(mf)
        super().__init__(mf, cfg, backend)
        rope_dim = int(mf.arch_key("rope.dimension_count", cfg.key_dim))
        self.rope = rope_from_file(mf, rope_dim, self.rope_neox, 10000.0)
        self.ropes = [self.rope]
        attn_scale = attention_scale(mf, cfg.key_dim)
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

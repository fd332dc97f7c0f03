"""`gemma3` architecture.

Interleaved attention: every `pattern`-th layer is global (RoPE base from the file, optional linear
scaling), the others use a sliding window with their own RoPE base (10000). QK RMSNorm, norms before
and after both attention and FFN, embeddings scaled by sqrt(n_embd), tied output, GeGLU (tanh GELU).
Norm weights in GGUF already include gemma's +1.
"""

from __future__ import annotations

import math

from gufo.gguf.model_file import ModelFile
from gufo.models.base import DecoderLayer, DecoderModel, ModelConfig, SelfAttention
from gufo.models.layers import Rope
from gufo.models.registry import register_architecture

LOCAL_ROPE_BASE = 10000.0
DEFAULT_SWA_PATTERN = 6


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
        for i in range(cfg.n_layers):
            is_global = window is None or (i + 1) % pattern == 0
            rope = global_rope if is_global else local_rope
            attn = SelfAttention(
                mf, f"blk.{i}", cfg, backend, rope, scale, qk_norm=True, window=None if is_global else window
            )
            self.layers.append(DecoderLayer(mf, i, cfg, backend, attn, "gelu_tanh", post_norms=True))

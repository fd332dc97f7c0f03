"""`gemma3` architecture.

Interleaved attention: the layers the sliding-window pattern marks use a window and their own RoPE
base (`rope.freq_base_swa`, 10000 when absent) without scaling; the others are global (RoPE base and
scaling from the file). `attention.sliding_window_pattern` is a period (every N-th layer global, 6 when
absent) or a per-layer list of booleans (true = sliding), as llama.cpp reads it. QK RMSNorm, norms
before and after both attention and FFN, embeddings scaled by sqrt(n_embd), tied output, GeGLU (tanh
GELU), optional final logit soft-capping. Norm weights in GGUF already include gemma's +1.

The attention scale is llama.cpp's (the file carries none): 1/sqrt(n_embd / n_head) for the 62-layer
model (Gemma 3 27B, whose query_pre_attn_scalar is hidden/heads), 1/sqrt(head_dim) otherwise.
"""

from __future__ import annotations

import math

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.models.base import DecoderLayer, DecoderModel, ModelConfig, SelfAttention
from gufo.models.registry import register_architecture
from gufo.models.rope import rope_from_file

LOCAL_ROPE_BASE = 10000.0
DEFAULT_SWA_PATTERN = 6
LAYERS_27B = 62  # llama.cpp's LLM_TYPE_27B for gemma3


def sliding_layers(mf: ModelFile, n_layers: int) -> list[bool]:
    """Per layer: whether it attends over a sliding window (llama.cpp's load_swa_pattern)."""
    pattern = mf.arch_key("attention.sliding_window_pattern", DEFAULT_SWA_PATTERN)
    if not int(mf.arch_key("attention.sliding_window", 0)):
        return [False] * n_layers
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise BadInputError(
                f"{mf.label}: attention.sliding_window_pattern has {len(pattern)} entries, "
                f"expected one per layer ({n_layers})"
            )
        return [bool(p) for p in pattern]
    period = int(pattern)
    if period <= 0:
        raise BadInputError(f"{mf.label}: attention.sliding_window_pattern must be positive, got {period}")
    return [(i + 1) % period != 0 for i in range(n_layers)]


@register_architecture("gemma3")
class Gemma3Model(DecoderModel):
    def __init__(self, mf: ModelFile, backend: str):
        cfg = ModelConfig.from_file(mf)
        super().__init__(mf, cfg, backend)
        self.embedding_scale = math.sqrt(cfg.n_embd)
        self.logit_softcap = float(mf.arch_key("final_logit_softcapping", 0.0)) or None
        window = int(mf.arch_key("attention.sliding_window", 0)) or None
        global_rope = rope_from_file(mf, cfg.key_dim, True, 1_000_000.0)
        local_rope = rope_from_file(
            mf, cfg.key_dim, True, LOCAL_ROPE_BASE, "rope.freq_base_swa", scaled=False
        )
        self.ropes = [global_rope, local_rope]
        scale_dim = cfg.n_embd // cfg.n_heads if cfg.n_layers == LAYERS_27B else cfg.key_dim
        scale = 1.0 / math.sqrt(scale_dim)
        for i, sliding in enumerate(sliding_layers(mf, cfg.n_layers)):
            rope = local_rope if sliding else global_rope
            attn = SelfAttention(
                mf, f"blk.{i}", cfg, backend, rope, scale, qk_norm=True, window=window if sliding else None
            )
            self.layers.append(DecoderLayer(mf, i, cfg, backend, attn, "gelu_tanh", post_norms=True))

"""`qwen3` architecture: the llama block with per-head QK RMSNorm and NeoX (half-split) RoPE."""

from __future__ import annotations

from gufo.models.archs.llama import LlamaModel
from gufo.models.registry import register_architecture


@register_architecture("qwen3")
class Qwen3Model(LlamaModel):
    rope_neox = True
    qk_norm = True

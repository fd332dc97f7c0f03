"""`qwen3next` architecture (Qwen3-Next): qwen35's hybrid token mixers with mixture-of-experts FFNs.

Differences from qwen35 in llama.cpp's converter layout:

- DeltaNet: HF's fused in_proj_qkvz is written split, as `attn_qkv` (all q, all k, all v) and
  `attn_gate` (z); `ssm_ba` keeps HF's per-key-head blocks [b x r, a x r] (r = value heads per key
  head). Value heads stay grouped by key head: value head h reads key head h // r.
- FFN: a block with `ffn_gate_inp` is a mixture of experts (see models/moe.py): softmax routing, top
  `expert_used_count` renormalised (llama.cpp always does, as Qwen3-Next's norm_topk_prob), plus the
  sigmoid-gated shared expert; a block without it is the dense SwiGLU.
"""

from __future__ import annotations

import torch

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.models.archs.qwen35 import DeltaNetShape, GatedDeltaNet, Qwen35Model
from gufo.models.moe import RoutedFFNs
from gufo.models.registry import register_architecture


class Qwen3NextDeltaNet(GatedDeltaNet):
    tiled_value_heads = False

    def __init__(self, mf: ModelFile, prefix: str, shape: DeltaNetShape, eps: float, backend: str):
        if f"{prefix}.attn_qkv.weight" not in mf.tensors and f"{prefix}.ssm_in.weight" in mf.tensors:
            raise BadInputError(
                f"{mf.label}: {prefix}.ssm_in (the older fused qkvz layout) is not supported; "
                "reconvert with a current llama.cpp convert_hf_to_gguf.py (attn_qkv + attn_gate)"
            )
        super().__init__(mf, prefix, shape, eps, backend)

    @staticmethod
    def projections(s: DeltaNetShape) -> dict[str, int]:
        return {"attn_qkv": s.channels, "attn_gate": s.value_heads * s.value_dim, "ssm_ba": 2 * s.value_heads}

    def project(self, x: torch.Tensor) -> list[torch.Tensor]:
        s, n = self.shape, x.shape[0]
        qkv, z, ba = self.in_proj(x)
        b, a = ba.reshape(n, s.key_heads, 2, s.value_heads // s.key_heads).unbind(2)
        return [qkv, z, b.reshape(n, -1), a.reshape(n, -1)]


@register_architecture("qwen3next")
class Qwen3NextModel(RoutedFFNs, Qwen35Model):
    delta_net = Qwen3NextDeltaNet

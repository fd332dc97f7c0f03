"""`qwen35moe` architecture (Qwen3.5/3.6-35B-A3B and larger): qwen35's hybrid token mixers (Gated
DeltaNet with value heads tiled over the key heads, separate `ssm_beta` / `ssm_alpha`; gated full
attention) with a mixture-of-experts FFN in every block (models/moe.py): softmax routing over
`expert_count` experts, the top `expert_used_count` renormalised, plus the sigmoid-gated shared expert.

llama.cpp's loader (src/models/qwen35moe.cpp) reads the expert keys and the shared expert's width from
the tensors; it always renormalises the chosen experts' weights (Qwen3.5-MoE's norm_topk_prob).
"""

from __future__ import annotations

from gufo.models.archs.qwen35 import Qwen35Model
from gufo.models.moe import RoutedFFNs
from gufo.models.registry import register_architecture


@register_architecture("qwen35moe")
class Qwen35MoeModel(RoutedFFNs, Qwen35Model):
    every_block_routed = True  # llama.cpp's loader requires ffn_gate_inp in each block

"""`gufo synth`: random-weight GGUF files of real model shapes, in llama-quantize's type mixes."""

from gufo.tools.synth.plan import plan_synth
from gufo.tools.synth.presets import PRESETS, ModelShape, Qwen3Shape, Qwen35Shape, find_preset
from gufo.tools.synth.qwen35 import plan_qwen35
from gufo.tools.synth.type_mix import MIXES, QuantMix, find_mix, tensor_type
from gufo.tools.synth.writer import PlannedTensor, SynthPlan, plan_qwen3, write_synth

__all__ = [
    "MIXES",
    "PRESETS",
    "ModelShape",
    "PlannedTensor",
    "QuantMix",
    "Qwen35Shape",
    "Qwen3Shape",
    "SynthPlan",
    "find_mix",
    "find_preset",
    "plan_qwen3",
    "plan_qwen35",
    "plan_synth",
    "tensor_type",
    "write_synth",
]

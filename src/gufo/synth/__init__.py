"""`gufo synth`: random-weight GGUF files of real model shapes, in llama-quantize's type mixes."""

from gufo.synth.presets import PRESETS, Qwen3Shape, find_preset
from gufo.synth.type_mix import MIXES, QuantMix, find_mix, tensor_type
from gufo.synth.writer import PlannedTensor, SynthPlan, plan_qwen3, write_synth

__all__ = [
    "MIXES",
    "PRESETS",
    "PlannedTensor",
    "QuantMix",
    "Qwen3Shape",
    "SynthPlan",
    "find_mix",
    "find_preset",
    "plan_qwen3",
    "tensor_type",
    "write_synth",
]

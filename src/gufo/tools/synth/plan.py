"""The planner of each architecture `gufo synth` writes."""

from __future__ import annotations

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.tools.synth.presets import ModelShape, Qwen3Shape, Qwen35Shape
from gufo.tools.synth.qwen35 import plan_qwen35
from gufo.tools.synth.type_mix import QuantMix
from gufo.tools.synth.writer import SynthPlan, plan_qwen3


def plan_synth(
    preset: str, shape: ModelShape, mix: QuantMix, vocab: ModelFile, mtp: bool = False
) -> SynthPlan:
    """The plan of the file for `shape`, in its architecture's layout (the shape's type names it);
    `mtp`: with the multi-token-prediction block (the Qwen3.5 shapes)."""
    if isinstance(shape, Qwen35Shape):
        return plan_qwen35(preset, shape, mix, vocab, mtp)
    assert isinstance(shape, Qwen3Shape)
    if mtp:
        raise BadInputError("--mtp: qwen3 has no multi-token-prediction block (qwen35 and qwen35moe do)")
    return plan_qwen3(preset, shape, mix, vocab)

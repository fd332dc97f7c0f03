"""Per-tensor types of a llama-quantize preset ("Q4_K_M", ...) for a dense Qwen3 or Qwen3.5 model.

The rules restate llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp) for the cases these
models reach: no experts, no importance matrix, not Falcon, never llama.cpp's 70B model type, and
rows whose width is a multiple of 256 (so no block-size fallback). llama-quantize visits the tensors
ordered by layer, so its attn_v / ffn_down counters equal the layer index used here. In qwen35,
llama.cpp counts the DeltaNet `attn_qkv` as attn_v-like: every layer has exactly one of the two, so
the counter is still the layer index. `tests/synth/make_type_mix_fixture.py` checks the qwen3 rules
against llama-quantize itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType, LlamaFileType

from gufo.errors import BadInputError
from gufo.tools.synth.presets import ModelShape

Q = GGMLQuantizationType


@dataclass(frozen=True)
class QuantMix:
    name: str  # llama-quantize's name, e.g. "Q4_K_M"
    file_type: LlamaFileType  # written as general.file_type
    base: GGMLQuantizationType  # the type of every matrix no rule singles out


_MIXES = [
    ("F16", Q.F16),
    ("Q4_0", Q.Q4_0),
    ("Q4_1", Q.Q4_1),
    ("Q5_0", Q.Q5_0),
    ("Q5_1", Q.Q5_1),
    ("Q8_0", Q.Q8_0),
    ("Q2_K", Q.Q2_K),
    ("Q3_K_S", Q.Q3_K),
    ("Q3_K_M", Q.Q3_K),
    ("Q3_K_L", Q.Q3_K),
    ("Q4_K_S", Q.Q4_K),
    ("Q4_K_M", Q.Q4_K),
    ("Q5_K_S", Q.Q5_K),
    ("Q5_K_M", Q.Q5_K),
    ("Q6_K", Q.Q6_K),
]
MIXES: dict[str, QuantMix] = {
    name: QuantMix(name, LlamaFileType[f"MOSTLY_{name}"], base) for name, base in _MIXES
}


def find_mix(name: str) -> QuantMix:
    """The mix called `name` (any case); a BadInputError says why another name is refused."""
    key = name.upper()
    if key in MIXES:
        return MIXES[key]
    supported = ", ".join(MIXES)
    if f"MOSTLY_{key}" in LlamaFileType.__members__ or key == "F32":
        raise BadInputError(
            f"--qtype {name}: a llama-quantize type that gufo synth does not generate "
            f"(importance-matrix, ternary, FP4 or other float types; supported: {supported})"
        )
    raise BadInputError(f"--qtype {name}: unknown quantization type (supported: {supported})")


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits: the first and last eighth, then every third."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


# Kept as converted: 1-D (ssm_a, ssm_dt.bias) or a conv kernel llama-quantize skips by name.
_FLOAT_KINDS = frozenset({"ssm_a", "ssm_dt", "ssm_conv1d"})
# llama.cpp's attn_v-like tensors: they share the attn_v rules and counter.
_ATTN_V_KINDS = frozenset({"attn_v", "attn_qkv"})


def tensor_type(mix: QuantMix, kind: str, layer: int, shape: ModelShape) -> GGMLQuantizationType:
    """The type llama-quantize gives tensor `kind` ("attn_v", "token_embd", ...) of block `layer`."""
    if kind.endswith("norm") or kind in _FLOAT_KINDS:
        return Q.F32  # 1-D tensors and conv kernels are never quantized
    if mix.base == Q.F16:
        return Q.F16  # a float target type turns every rule off
    n_layers, name = shape.num_hidden_layers, mix.name
    if kind == "output" or (kind == "token_embd" and shape.tie_word_embeddings):
        # A tied embedding is also the output matrix, so it gets the output's type.
        return Q.Q8_0 if mix.base == Q.Q8_0 else Q.Q6_K
    if kind in _ATTN_V_KINDS:
        if name == "Q2_K":
            return Q.Q4_K if shape.n_gqa >= 4 else Q.Q3_K
        if name == "Q3_K_M":
            return Q.Q5_K if layer < 2 else Q.Q4_K
        if name == "Q3_K_L":
            return Q.Q5_K
        if name in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layers):
            return Q.Q6_K
        if name == "Q4_K_S" and layer < 4:
            return Q.Q5_K
    elif kind == "ffn_down":
        if name == "Q2_K":
            return Q.Q3_K
        if name == "Q3_K_M":
            return Q.Q5_K if layer < n_layers // 16 else Q.Q4_K
        if name == "Q3_K_L":
            return Q.Q5_K
        if name in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layers):
            return Q.Q6_K
        if name == "Q4_K_S" and layer < n_layers // 8:
            return Q.Q5_K
    elif kind == "attn_output":
        upgrade = {"Q2_K": Q.Q3_K, "Q3_K_M": Q.Q4_K, "Q3_K_L": Q.Q5_K}
        return upgrade.get(name, mix.base)
    return mix.base

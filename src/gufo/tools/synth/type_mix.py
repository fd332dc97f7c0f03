"""Per-tensor types of a llama-quantize preset ("Q4_K_M", ...) for a Qwen3, Qwen3.5 or Qwen3.5-MoE model.

The rules restate llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp) for the cases these
models reach: never exactly 8 experts (llama.cpp's rules for those), not Falcon, never llama.cpp's 70B
model type, and rows whose width is a multiple of 256 (so no block-size fallback). Expert tensors fall
in llama.cpp's categories by name: ffn_down_exps and ffn_down_shexp are ffn_down, and so on; with
experts it reads the layer from the tensor's name, which is the index used here too. The router
`ffn_gate_inp` is never quantized. An importance matrix is assumed exactly for the mixes
llama-quantize refuses to make without one (those whose tensors get IQ1/IQ2/IQ3_XXS types: `imatrix`),
as the published files of those types are made; it changes only IQ3_XXS's attn_v and ffn_down here.
llama-quantize visits the tensors ordered by layer, so its attn_v / ffn_down counters equal the layer
index used here. In qwen35, llama.cpp counts the DeltaNet `attn_qkv` as attn_v-like: every layer has
exactly one of the two, so the counter is still the layer index. `tests/synth/make_type_mix_fixture.py`
checks the qwen3 rules against llama-quantize itself.
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
    imatrix: bool = False  # made with an importance matrix (llama-quantize needs one for this mix)
    dynamic: bool = False  # a per-layer mix of our own rule (DYNAMIC_MIXES), not a llama-quantize preset


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
    ("IQ4_NL", Q.IQ4_NL),
    ("IQ4_XS", Q.IQ4_XS),
    ("IQ3_M", Q.IQ3_S),
    ("IQ3_S", Q.IQ3_S),
    ("IQ3_XS", Q.IQ3_S),
    ("IQ3_XXS", Q.IQ3_XXS),
    ("IQ2_M", Q.IQ2_S),
    ("IQ2_S", Q.IQ2_XS),
    ("IQ2_XS", Q.IQ2_XS),
    ("IQ2_XXS", Q.IQ2_XXS),
    ("IQ1_M", Q.IQ1_M),
    ("IQ1_S", Q.IQ1_S),
    ("TQ2_0", Q.TQ2_0),
    ("TQ1_0", Q.TQ1_0),
]
# Mixes whose matrices get IQ1/IQ2/IQ3_XXS types, which llama-quantize makes only with an importance matrix.
_IMATRIX_MIXES = frozenset({"IQ3_XS", "IQ3_XXS", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S"})
MIXES: dict[str, QuantMix] = {
    name: QuantMix(name, LlamaFileType[f"MOSTLY_{name}"], base, name in _IMATRIX_MIXES)
    for name, base in _MIXES
}
# Dynamic mixes modelled on unsloth's "UD" files (docs/decisions.md, "The UD-like synth mix"): what
# llama-quantize writes with per-tensor --tensor-type overrides, so no preset of its own; the file type
# stays the base preset's, as in the published UD files.
DYNAMIC_MIXES: dict[str, QuantMix] = {
    "UD-Q4_K_XL": QuantMix("UD-Q4_K_XL", LlamaFileType.MOSTLY_Q4_K_M, Q.Q4_K, imatrix=True, dynamic=True),
}
# llama.cpp's 2-bit and 1-bit mixes: their own rules for attn_v, ffn_down and attn_output, none else;
# the two with an IQ2_S base upgrade to IQ3_S where the others upgrade to Q2_K.
_LOW_BIT = frozenset({"IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"})
_LOW_BIT_UPGRADE = {"IQ2_S": Q.IQ3_S, "IQ2_M": Q.IQ3_S}  # else Q2_K


def find_mix(name: str) -> QuantMix:
    """The mix called `name` (any case); a BadInputError says why another name is refused."""
    key = name.upper()
    if key in MIXES or key in DYNAMIC_MIXES:
        return MIXES.get(key) or DYNAMIC_MIXES[key]
    supported = ", ".join([*MIXES, *DYNAMIC_MIXES])
    if f"MOSTLY_{key}" in LlamaFileType.__members__ or key == "F32":
        raise BadInputError(
            f"--qtype {name}: a llama-quantize type that gufo synth does not generate "
            f"(Q2_K_S, the FP4 and Q1_0 types, float types but F16; supported: {supported})"
        )
    raise BadInputError(f"--qtype {name}: unknown quantization type (supported: {supported})")


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers that get more bits: the first and last eighth, then every third."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


# Kept as converted: 1-D (ssm_a, ssm_dt.bias; the shared expert's gate [1, n] is 1-D to ggml), a conv
# kernel or the expert router, which llama-quantize skips by name.
_FLOAT_KINDS = frozenset({"ssm_a", "ssm_dt", "ssm_conv1d", "ffn_gate_inp", "ffn_gate_inp_shexp"})
# llama.cpp's categories of the expert tensors (tensor_get_category: by substring of the name)
_EXPERT_CATEGORY = {
    f"ffn_{part}_{suffix}": f"ffn_{part}" for part in ("gate", "up", "down") for suffix in ("exps", "shexp")
}
# llama.cpp's attn_v-like tensors: they share the attn_v rules and counter.
_ATTN_V_KINDS = frozenset({"attn_v", "attn_qkv"})


def tensor_type(mix: QuantMix, kind: str, layer: int, shape: ModelShape) -> GGMLQuantizationType:
    """The type llama-quantize gives tensor `kind` ("attn_v", "token_embd", ...) of block `layer`."""
    if kind.endswith("norm") or kind in _FLOAT_KINDS:
        return Q.F32  # 1-D tensors and conv kernels are never quantized
    if mix.base == Q.F16:
        return Q.F16  # a float target type turns every rule off
    kind = _EXPERT_CATEGORY.get(kind, kind)
    if kind == "output" or (kind == "token_embd" and shape.tie_word_embeddings):
        # A tied embedding is also the output matrix, so it gets the output's type.
        if mix.name in _LOW_BIT or mix.name == "IQ3_XXS":
            return Q.Q5_K
        return Q.Q8_0 if mix.base == Q.Q8_0 else Q.Q6_K
    if kind == "token_embd":
        return _token_embd_type(mix)
    if mix.dynamic:
        return _ud_q4_k_xl_type(kind, layer, shape)
    if mix.name in _LOW_BIT:
        return _low_bit_type(mix, kind, layer, shape)
    return _general_type(mix, kind, layer, shape)


def _token_embd_type(mix: QuantMix) -> GGMLQuantizationType:
    if mix.name in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"):
        return Q.Q2_K
    if mix.name in ("IQ2_S", "IQ2_M", "IQ3_XXS"):
        return Q.IQ3_S
    if mix.name in ("TQ1_0", "TQ2_0"):
        return Q.Q4_K
    return mix.base


def _low_bit_type(mix: QuantMix, kind: str, layer: int, shape: ModelShape) -> GGMLQuantizationType:
    upgrade = _LOW_BIT_UPGRADE.get(mix.name, Q.Q2_K)
    if kind in _ATTN_V_KINDS:
        return Q.Q4_K if shape.n_gqa >= 4 or shape.n_experts >= 4 else upgrade
    if kind == "ffn_down":
        return upgrade if layer < shape.num_hidden_layers // 8 else mix.base
    if kind == "attn_output":
        if mix.name in ("IQ1_S", "IQ1_M"):
            return Q.IQ2_XXS
        if mix.name in ("IQ2_S", "IQ2_M"):
            return Q.IQ3_S
    return mix.base


def _general_type(mix: QuantMix, kind: str, layer: int, shape: ModelShape) -> GGMLQuantizationType:
    n_layers, name = shape.num_hidden_layers, mix.name
    if kind in _ATTN_V_KINDS:
        if name == "Q2_K":
            return Q.Q4_K if shape.n_gqa >= 4 else Q.Q3_K
        if name == "IQ3_XXS":
            return Q.Q4_K if shape.n_gqa >= 4 else (Q.IQ3_XXS if mix.imatrix else Q.IQ3_S)
        if name in ("IQ3_XS", "IQ3_S") and shape.n_gqa >= 4:
            return Q.Q4_K
        if name == "IQ3_M":
            return Q.Q4_K
        if name == "Q3_K_M":
            return Q.Q5_K if layer < 2 else Q.Q4_K
        if name == "Q3_K_L":
            return Q.Q5_K
        if name in ("IQ4_NL", "IQ4_XS") and shape.n_gqa >= 4:
            return Q.Q5_K
        if name in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layers):
            return Q.Q6_K
        if name == "Q4_K_S" and layer < 4:
            return Q.Q5_K
    elif kind in ("attn_k", "attn_q"):
        return {"IQ3_XS": Q.IQ3_XXS, "IQ3_XXS": Q.IQ2_S}.get(name, mix.base)
    elif kind == "ffn_down":
        if name == "Q2_K":
            return Q.Q3_K
        if name == "IQ3_XXS" and not mix.imatrix:
            return Q.Q4_K if layer < n_layers // 8 else Q.Q3_K
        if name == "Q3_K_M":
            return Q.Q5_K if layer < n_layers // 16 else Q.Q4_K
        if name == "IQ3_M" and layer < n_layers // 8:
            return Q.Q4_K
        if name == "Q3_K_L":
            return Q.Q5_K
        if name in ("Q4_K_M", "Q5_K_M") and use_more_bits(layer, n_layers):
            return Q.Q6_K
        if name in ("IQ4_NL", "IQ4_XS") and layer < n_layers // 8 and not mix.imatrix:
            return Q.Q5_K
        if name == "Q4_K_S" and layer < n_layers // 8:
            return Q.Q5_K
    elif kind == "attn_output":
        upgrade = {"Q2_K": Q.Q3_K, "IQ3_XXS": Q.IQ3_S, "Q3_K_M": Q.Q4_K, "Q3_K_L": Q.Q5_K, "IQ3_M": Q.Q4_K}
        return upgrade.get(name, mix.base)
    elif kind in ("ffn_gate", "ffn_up") and name == "IQ3_XS" and n_layers // 8 <= layer < 7 * n_layers // 8:
        return Q.IQ3_XXS
    return mix.base


# The tensors that carry the residual stream's writes and the value path: more bits, as llama.cpp's
# Q4_K_M gives them, and never below Q5_K.
_UD_SENSITIVE_KINDS = frozenset({"attn_v", "attn_qkv", "ffn_down"})
# The output projections of attention and DeltaNet, and DeltaNet's output gate: IQ4_NL in the middle layers.
_UD_NL_KINDS = frozenset({"attn_output", "ssm_out", "attn_gate"})


def _ud_q4_k_xl_type(kind: str, layer: int, shape: ModelShape) -> GGMLQuantizationType:
    """UD-Q4_K_XL: the value path and ffn_down at Q6_K in llama.cpp's more-bits layers and Q5_K in the
    others; every other matrix Q4_K in the first and last eighth of the layers (the sensitive ends) and
    in between IQ4_NL for the mixers' output projections and gate, IQ4_XS for the rest."""
    n_layers = shape.num_hidden_layers
    if kind in _UD_SENSITIVE_KINDS:
        return Q.Q6_K if use_more_bits(layer, n_layers) else Q.Q5_K
    if layer < n_layers // 8 or layer >= 7 * n_layers // 8:
        return Q.Q4_K
    return Q.IQ4_NL if kind in _UD_NL_KINDS else Q.IQ4_XS

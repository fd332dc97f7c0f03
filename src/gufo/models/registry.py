"""Architecture registry keyed by `general.architecture`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gufo.errors import BadInputError
from gufo.formats import unsupported_reason
from gufo.gguf.model_file import ModelFile

ARCHITECTURE_MODULES = ("llama", "qwen3", "gemma3", "qwen35", "qwen3next", "qwen35moe")
# The architectures whose every layer is self-attention and a dense FFN: on a GPU their prefill replays
# graphs, so several prompts' chunks can share a pass (Engine.packs_prefill); the others' (hybrid token
# mixers, experts) cannot
PACKING_ARCHITECTURES = frozenset({"llama", "qwen3", "gemma3"})

# Metadata (after `<architecture>.`) that changes the math where llama.cpp's loader reads it. A model
# reads the ones it implements while it is built; any other one present in a file is refused by name
# (docs/models.md lists what each architecture implements).
MATH_KEYS = frozenset(
    [
        "activation.situ_beta",
        "activation.situ_linear_beta",
        "swiglu_clamp_exp",
        "swiglu_clamp_shexp",
        "use_parallel_residual",
        "expert_shared_count",
        "expert_group_count",
        "expert_group_used_count",
        "expert_weights_scale",
        "expert_weights_norm",
        "expert_gating_func",
        "expert_group_scale",
        "experts_per_group",
        "moe_every_n_layers",
        "leading_dense_block_count",
        "interleave_moe_layer_step",
        "nextn_predict_layers",
        "logit_scale",
        "attn_logit_softcapping",
        "router_logit_softcapping",
        "final_logit_softcapping",
        "residual_scale",
        "embedding_scale",
        "rescale_every_n_layers",
        "full_attention_interval",
        "num_loops",
        "attention.max_alibi_bias",
        "attention.clamp_kqv",
        "attention.causal",
        "attention.sliding_window",
        "attention.sliding_window_pattern",
        "attention.rope_pattern",
        "attention.scale",
        "attention.output_scale",
        "attention.value_scale",
        "attention.temperature_length",
        "attention.temperature_scale",
        "attention.key_length_swa",
        "attention.value_length_swa",
        "attention.recurrent_layers",
        "attention.shared_kv_layers",
        "rope.dimension_count",
        "rope.dimension_count_swa",
        "rope.dimension_sections",
        "rope.freq_base",
        "rope.freq_base_swa",
        "rope.scale_linear",
        "rope.scaling.type",
        "rope.scaling.factor",
        "rope.scaling.alpha",
        "rope.scaling.attn_factor",
        "rope.scaling.original_context_length",
        "rope.scaling.yarn_log_multiplier",
        "rope.scaling.yarn_ext_factor",
        "rope.scaling.yarn_attn_factor",
        "rope.scaling.yarn_beta_fast",
        "rope.scaling.yarn_beta_slow",
        "ssm.dt_b_c_rms",
        "norm_before_residual",
    ]
)
_ARCHITECTURES: dict[str, Callable[[ModelFile, str], Any]] = {}


def register_architecture(name: str) -> Callable[[Any], Any]:
    def decorate(cls: Any) -> Any:
        _ARCHITECTURES[name] = cls
        return cls

    return decorate


def known_architectures() -> list[str]:
    for module in ARCHITECTURE_MODULES:
        importlib.import_module(f"gufo.models.archs.{module}")
    return sorted(_ARCHITECTURES)


def check_architecture(mf: ModelFile) -> str:
    arch = mf.architecture
    known = known_architectures()
    if arch not in _ARCHITECTURES:
        raise BadInputError(f"{mf.label}: unknown architecture '{arch}' (supported: {', '.join(known)})")
    return arch


def check_supported_types(mf: ModelFile) -> None:
    """Fail at load, naming the tensor, when a tensor's block format has no implementation."""
    for info in mf.tensors.values():
        reason = unsupported_reason(info.qtype)
        if reason is not None:
            raise BadInputError(f"{mf.label}: tensor {info.name}: {reason}")


def check_fully_read(mf: ModelFile, model: Any) -> None:
    """Refuse, naming it, a tensor the model did not load (unless the model knows it is unused, e.g.
    multi-token-prediction blocks) or a math-bearing key it did not read: either would change the
    logits llama.cpp computes from the file, so running without it would be silently wrong."""
    for name in mf.tensors:
        if name not in mf.used_tensors and not model.known_unused(name):
            raise BadInputError(
                f"{mf.label}: tensor {name} is not used by gufo's {mf.architecture} model "
                "(running without it would give wrong logits)"
            )
    prefix = f"{mf.architecture}."
    for key in mf.metadata:
        if key.startswith(prefix) and key[len(prefix) :] in MATH_KEYS and key not in mf.read_keys:
            raise BadInputError(
                f"{mf.label}: metadata key {key} = {mf.metadata[key]!r} is not implemented for "
                f"{mf.architecture} (running without it would give wrong logits)"
            )


def build_model(mf: ModelFile, backend: str, build: Callable[..., Any] | None = None) -> Any:
    """The model; refused when the file holds a tensor or math-bearing key the model does not implement.
    `build(architecture, mf, backend)` replaces the architecture's constructor (gufo.parallel builds a
    rank's shard with it)."""
    architecture = _ARCHITECTURES[check_architecture(mf)]
    model = architecture(mf, backend) if build is None else build(architecture, mf, backend)
    check_fully_read(mf, model)
    return model

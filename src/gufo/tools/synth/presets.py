"""Model shapes that `gufo synth` can write, taken from the official Hugging Face configs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Self

from gufo.errors import BadInputError


class _Layered:
    """What the type mix and --layers need of a shape (its dataclass fields carry the values)."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool

    @property
    def n_gqa(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def n_experts(self) -> int:
        """Routed experts per FFN (0: a dense FFN)."""
        return 0

    def with_layers(self, n_layers: int) -> Self:
        return replace(self, num_hidden_layers=n_layers)


@dataclass(frozen=True)
class Qwen3Shape(_Layered):
    """The hyperparameters of a dense Qwen3 model (names follow the HF config.json fields)."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    tie_word_embeddings: bool
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960


@dataclass(frozen=True)
class Qwen35Shape(_Layered):
    """A dense Qwen3.5 model (HF qwen3_5_text config fields): Gated DeltaNet layers ("linear_*") with a
    gated full-attention layer every `full_attention_interval` layers."""

    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    linear_num_value_heads: int
    tie_word_embeddings: bool
    head_dim: int = 256
    linear_num_key_heads: int = 16
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 262144

    def is_recurrent(self, layer: int) -> bool:
        return (layer + 1) % self.full_attention_interval != 0


@dataclass(frozen=True)
class Qwen35MoeShape(Qwen35Shape):
    """A Qwen3.5 mixture-of-experts model (HF qwen3_5_moe_text config fields): qwen35's hybrid layers,
    each FFN `num_experts` routed experts (`num_experts_per_tok` per token) plus one shared expert.
    `intermediate_size` is 0: the config has no dense FFN width (the converter writes none)."""

    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512

    @property
    def n_experts(self) -> int:
        return self.num_experts


ModelShape = Qwen3Shape | Qwen35Shape


# Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B} config.json (the small three tie the output to the embeddings).
QWEN3_PRESETS: dict[str, Qwen3Shape] = {
    "0.6b": Qwen3Shape(1024, 28, 3072, 16, 8, tie_word_embeddings=True),
    "1.7b": Qwen3Shape(2048, 28, 6144, 16, 8, tie_word_embeddings=True),
    "4b": Qwen3Shape(2560, 36, 9728, 32, 8, tie_word_embeddings=True),
    "8b": Qwen3Shape(4096, 36, 12288, 32, 8, tie_word_embeddings=False),
    "14b": Qwen3Shape(5120, 40, 17408, 40, 8, tie_word_embeddings=False),
    "32b": Qwen3Shape(5120, 64, 25600, 64, 8, tie_word_embeddings=False),
}

# Qwen/Qwen3.5-{0.8B,27B} config.json text_config (the 0.8B ties the output to the embeddings); the
# multi-token-prediction layer (mtp_num_hidden_layers 1) is left out, as `convert_hf_to_gguf.py --no-mtp`
# does.
QWEN35_PRESETS: dict[str, Qwen35Shape] = {
    "0.8b": Qwen35Shape(1024, 24, 3584, 8, 2, linear_num_value_heads=16, tie_word_embeddings=True),
    "27b": Qwen35Shape(5120, 64, 17408, 24, 4, linear_num_value_heads=48, tie_word_embeddings=False),
}

# Qwen/Qwen3.5-35B-A3B config.json text_config (Qwen3.6-35B-A3B has the same shape), without the MTP
# layer as above; "tiny" is no real model: a small shape whose every matrix row is a whole number of
# 256-wide blocks, for tests (16 experts: llama-quantize's rules for 8-expert models stay out of play).
QWEN35MOE_PRESETS: dict[str, Qwen35MoeShape] = {
    "35b-a3b": Qwen35MoeShape(2048, 40, 0, 16, 2, linear_num_value_heads=32, tie_word_embeddings=False),
    "tiny": Qwen35MoeShape(
        256,
        4,
        0,
        4,
        2,
        linear_num_value_heads=4,
        tie_word_embeddings=False,
        head_dim=64,
        linear_num_key_heads=2,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
    ),
}

PRESETS: dict[str, dict[str, ModelShape]] = {
    "qwen3": QWEN3_PRESETS,
    "qwen35": QWEN35_PRESETS,
    "qwen35moe": QWEN35MOE_PRESETS,
}


def find_preset(arch: str, preset: str) -> ModelShape:
    """The shape of `preset` for `arch`; a BadInputError names the known ones otherwise."""
    shapes = PRESETS.get(arch)
    if shapes is None:
        raise BadInputError(f"--arch {arch}: unknown architecture (known: {', '.join(PRESETS)})")
    shape = shapes.get(preset.lower())
    if shape is None:
        raise BadInputError(f"--preset {preset}: unknown {arch} preset (known: {', '.join(shapes)})")
    return shape

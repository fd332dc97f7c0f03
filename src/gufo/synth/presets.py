"""Model shapes that `gufo synth` can write, taken from the official Hugging Face configs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gufo.errors import BadInputError


@dataclass(frozen=True)
class Qwen3Shape:
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

    @property
    def n_gqa(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    def with_layers(self, n_layers: int) -> Qwen3Shape:
        return replace(self, num_hidden_layers=n_layers)


# Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B} config.json (the small three tie the output to the embeddings).
QWEN3_PRESETS: dict[str, Qwen3Shape] = {
    "0.6b": Qwen3Shape(1024, 28, 3072, 16, 8, tie_word_embeddings=True),
    "1.7b": Qwen3Shape(2048, 28, 6144, 16, 8, tie_word_embeddings=True),
    "4b": Qwen3Shape(2560, 36, 9728, 32, 8, tie_word_embeddings=True),
    "8b": Qwen3Shape(4096, 36, 12288, 32, 8, tie_word_embeddings=False),
    "14b": Qwen3Shape(5120, 40, 17408, 40, 8, tie_word_embeddings=False),
    "32b": Qwen3Shape(5120, 64, 25600, 64, 8, tie_word_embeddings=False),
}

PRESETS: dict[str, dict[str, Qwen3Shape]] = {"qwen3": QWEN3_PRESETS}


def find_preset(arch: str, preset: str) -> Qwen3Shape:
    """The shape of `preset` for `arch`; a BadInputError names the known ones otherwise."""
    shapes = PRESETS.get(arch)
    if shapes is None:
        raise BadInputError(f"--arch {arch}: unknown architecture (known: {', '.join(PRESETS)})")
    shape = shapes.get(preset.lower())
    if shape is None:
        raise BadInputError(f"--preset {preset}: unknown {arch} preset (known: {', '.join(shapes)})")
    return shape

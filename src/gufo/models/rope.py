"""Rotary position embedding and the scalings a GGUF can carry, as llama.cpp's `ggml_rope_ext` defines them.

Every backend rotates by the same cos/sin tables (`Rope.tables`), so a scaling is implemented once here
for the CPU, the Triton kernels, prefill, decode and graph capture alike:

- linear: positions divided by `rope.scaling.factor` (freq_scale = 1 / factor);
- llama3: the `rope_freqs.weight` tensor divides each frequency by its factor (the converter computes
  them from `rope_scaling`);
- YaRN: each frequency blends its interpolated (divided by the factor) and extrapolated values along a
  ramp between the correction dimensions of `beta_fast` and `beta_slow` rotations over the original
  context, and cos/sin are scaled by the attention factor (0.1 ln(factor) + 1 unless the file gives
  `rope.scaling.yarn_attn_factor`);
- `rope.scaling.attn_factor` multiplies cos/sin under any scaling.
Other scaling types (longrope) are refused by name; so is YaRN's log multiplier (gufo.models.registry's
MATH_KEYS: never read here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.kernels.linear_reference import dequantize_tensor

YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # llama.cpp's defaults (llama-hparams.h)
FREQ_FACTORS = "rope_freqs.weight"


@dataclass(frozen=True)
class Yarn:
    original_context: int
    ext_factor: float = 1.0  # how much of the ramp extrapolates (llama.cpp's yarn_ext_factor)
    beta_fast: float = YARN_BETA_FAST
    beta_slow: float = YARN_BETA_SLOW

    def correction_dims(self, dim: int, base: float) -> tuple[float, float]:
        """The first and last rotated pair of the ramp (ggml_rope_yarn_corr_dims)."""

        def corr_dim(rotations: float) -> float:
            return dim * math.log(self.original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = math.floor(corr_dim(self.beta_fast)), math.ceil(corr_dim(self.beta_slow))
        return max(0.0, low), min(dim - 1.0, high)


@dataclass(frozen=True)
class Rope:
    """Rotary embedding. `neox` rotates halves (x[i], x[i+d/2]); otherwise adjacent pairs (GGML mode 0)."""

    dim: int
    base: float
    neox: bool
    scale: float = 1.0  # position interpolation factor: frequencies divided by it (linear, YaRN)
    freq_factors: tuple[float, ...] | None = None  # per rotated pair: its frequency divided by it
    yarn: Yarn | None = None
    mscale: float = 1.0  # cos and sin multiplied by it

    def inverse_frequencies(self) -> torch.Tensor:
        """Radians per position of each rotated pair, float64 [dim / 2]."""
        pairs = torch.arange(0, self.dim, 2, dtype=torch.float64)
        extrapolated = 1.0 / self.base ** (pairs / self.dim)
        if self.freq_factors is not None:
            extrapolated = extrapolated / torch.tensor(self.freq_factors, dtype=torch.float64)
        interpolated = extrapolated / self.scale
        if self.yarn is None:
            return interpolated
        low, high = self.yarn.correction_dims(self.dim, self.base)
        ramp = 1.0 - ((pairs / 2 - low) / max(0.001, high - low)).clamp(0.0, 1.0)
        mix = ramp * self.yarn.ext_factor
        return interpolated * (1 - mix) + extrapolated * mix

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin per rotated column, [T, dim], laid out to match `rotated`."""
        angles = positions.to(torch.float64)[:, None] * self.inverse_frequencies()[None, :]
        cos, sin = angles.cos() * self.mscale, angles.sin() * self.mscale
        cos, sin = cos.to(torch.float32), sin.to(torch.float32)
        if self.neox:
            return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
        return cos.repeat_interleave(2, -1), torch.stack((-sin, sin), -1).flatten(-2)


def rope_from_file(
    mf: ModelFile,
    dim: int,
    neox: bool,
    default_base: float,
    base_key: str = "rope.freq_base",
    scaled: bool = True,
) -> Rope:
    """The rope a file's metadata describes (as llama.cpp's loader reads it); `scaled=False` for the
    rope of sliding-window layers, which llama.cpp never scales."""
    base = float(mf.arch_key(base_key, default_base))
    mscale = float(mf.arch_key("rope.scaling.attn_factor", 1.0))
    if not scaled:
        return Rope(dim, base, neox, mscale=mscale)
    kind = str(mf.arch_key("rope.scaling.type", "linear" if _has(mf, "rope.scaling.factor") else "none"))
    factor = float(mf.arch_key("rope.scaling.factor", 0.0) or mf.arch_key("rope.scale_linear", 0.0) or 1.0)
    if kind not in ("none", "linear", "yarn"):
        raise BadInputError(f"{mf.label}: rope scaling type '{kind}' is not supported (none, linear, yarn)")
    factors = _freq_factors(mf, dim)
    if kind == "none":
        return Rope(dim, base, neox, freq_factors=factors, mscale=mscale)
    if kind == "linear":
        return Rope(dim, base, neox, factor, factors, mscale=mscale)
    original = int(mf.arch_key("rope.scaling.original_context_length", mf.arch_key("context_length")))
    yarn = Yarn(
        original,
        float(mf.arch_key("rope.scaling.yarn_ext_factor", 1.0)),
        float(mf.arch_key("rope.scaling.yarn_beta_fast", YARN_BETA_FAST)),
        float(mf.arch_key("rope.scaling.yarn_beta_slow", YARN_BETA_SLOW)),
    )
    default_attention = 0.1 * math.log(factor) + 1.0 if factor > 1.0 and yarn.ext_factor else 1.0
    attention = float(mf.arch_key("rope.scaling.yarn_attn_factor", default_attention))
    return Rope(dim, base, neox, factor, factors, yarn, mscale * attention)


def _has(mf: ModelFile, suffix: str) -> bool:
    return mf.arch_key(suffix, None) is not None


def _freq_factors(mf: ModelFile, dim: int) -> tuple[float, ...] | None:
    if FREQ_FACTORS not in mf.tensors:
        return None
    values = dequantize_tensor(mf.tensor(FREQ_FACTORS)).reshape(-1)
    if values.numel() != dim // 2:
        raise BadInputError(
            f"{mf.label}: tensor {FREQ_FACTORS} has {values.numel()} values, expected {dim // 2}"
        )
    return tuple(float(v) for v in values)

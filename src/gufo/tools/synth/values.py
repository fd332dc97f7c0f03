"""Values of the tensors `gufo synth` keeps in float32: norm weights, the DeltaNet decay and conv, and
the expert router."""

from __future__ import annotations

import numpy as np


def float_values(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray | None:
    """float32 values of tensor `kind`, or None for a matrix that gets random quantized blocks."""
    if kind == "ssm_a":
        # -exp(A_log) with A uniform in [1, 16]: HF's initialisation U(0, 16) without the decay-free 0.
        return -rng.uniform(1.0, 16.0, size=shape).astype(np.float32)
    if kind == "ssm_conv1d":
        # PyTorch's default Conv1d initialisation for one input channel per group: U(+-1/sqrt(kernel)).
        bound = 1.0 / np.sqrt(shape[-1])
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)
    if kind in ("ffn_gate_inp", "ffn_gate_inp_shexp"):
        # The expert router and the shared expert's gate row, which llama-quantize leaves float: the
        # random matrices' deviation.
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)
    if len(shape) == 1:
        # Norm weights (the converter's 1 + w with w initialised to 0) and dt_bias (HF initialises ones):
        # 1.0, so the random matrices alone set the scale.
        return np.ones(shape, dtype=np.float32)
    return None

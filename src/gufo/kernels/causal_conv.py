"""The "causal_conv1d" op: a short depthwise causal convolution that carries its input window as state.

Per channel c: y_t = sum_j w[c, j] x_{t - K + 1 + j}; the state holds the last K - 1 inputs of the
sequence so far (zeros at its start), so a sequence cut into any pieces gives the same outputs.
"""

from __future__ import annotations

import torch

from gufo.kernels.contracts import CAUSAL_CONV1D, CausalConvKernel, restart_state
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


class ReferenceCausalConv1d(CausalConvKernel):
    name = "torch-causal-conv1d"

    @staticmethod
    def apply(
        x: torch.Tensor,
        state: torch.Tensor,
        weight: torch.Tensor,
        slots: torch.Tensor | None = None,
        restart: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x: [T, C]; state: [C, K - 1], advanced in place; weight: [C, K]. Returns [T, C]. With `slots`
        ([T] int64) state is a layer's [slots, C, K - 1] and token t the next of slot slots[t]; `restart`
        as `contracts.restart_state` says."""
        if slots is not None:
            rows = [
                ReferenceCausalConv1d.apply(x[t : t + 1], state[s], weight)
                for t, s in enumerate(slots.tolist())
            ]
            return torch.cat(rows) if rows else torch.empty_like(x)
        restart_state(state, restart)
        n_tokens, width = x.shape[0], weight.shape[1]
        window = torch.cat((state, x.T), dim=1)  # [C, K - 1 + T]
        # K shifted multiply-adds: exact float32 on every device (cuDNN's conv may round to TF32)
        out = window[:, :n_tokens] * weight[:, :1]
        for j in range(1, width):
            out = out + window[:, j : j + n_tokens] * weight[:, j : j + 1]
        if state.shape[1]:
            state.copy_(window[:, -state.shape[1] :])
        return out.T


KERNELS = (Registration(REFERENCE_BACKEND, CAUSAL_CONV1D, ReferenceCausalConv1d()),)

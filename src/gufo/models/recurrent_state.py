"""Per-slot state of recurrent (linear-attention) layers, owned by the KV cache.

Each such layer keeps, per slot, the last inputs of its causal conv ([channels, kernel - 1]) and the
delta-rule matrices ([heads, key_dim, value_dim]). Unlike KV entries they summarise the whole sequence
and cannot be rewound by position: snapshots and speculative rollback copy them (`save`/`load`); a
multi-token pass that steps the layers token by token (speculative verification) can copy the state
after each of its tokens as it goes (`keep_steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecurrentShape:
    layers: tuple[int, ...]  # indices of the layers that hold state
    conv: tuple[int, int]  # channels, kernel - 1
    delta: tuple[int, int, int]  # heads, key_dim, value_dim


class RecurrentState:
    def __init__(
        self,
        shape: RecurrentShape,
        n_slots: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        self.shape = shape
        self.conv = {i: torch.zeros(n_slots, *shape.conv, dtype=dtype, device=device) for i in shape.layers}
        self.delta = {i: torch.zeros(n_slots, *shape.delta, dtype=dtype, device=device) for i in shape.layers}
        self._steps: tuple[int, list[list[torch.Tensor]]] | None = None  # (slot, buffers): `keep_steps`

    def keep_steps(self, slot: int, buffers: list[list[torch.Tensor]] | None) -> None:
        """From now on, the state of `slot` after token t of a pass that steps the layers token by token
        goes into buffers[t] (laid out as `save`'s result), for t < len(buffers); None stops it."""
        self._steps = None if buffers is None else (slot, buffers)

    def keeping(self, slot: int) -> bool:
        """Whether a pass on `slot` is to keep the state after its tokens (`keep_steps`)."""
        return self._steps is not None and self._steps[0] == slot and bool(self._steps[1])

    def stepped(self, layer: int, slot: int, token: int) -> None:
        """A recurrent layer has advanced `slot` by token `token` of its pass (see `keep_steps`)."""
        if self._steps is None or self._steps[0] != slot or token >= len(self._steps[1]):
            return
        buffers, index = self._steps[1][token], self.shape.layers.index(layer)
        buffers[index].copy_(self.conv[layer][slot])
        buffers[len(self.shape.layers) + index].copy_(self.delta[layer][slot])

    def tensors(self, slot: int) -> list[torch.Tensor]:
        """Views of the slot's state in every layer (conv windows, then delta matrices)."""
        return [t[slot] for t in (*self.conv.values(), *self.delta.values())]

    def save(self, slot: int, into: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Copies of the slot's state, written into `into` (an earlier save's result) when given."""
        if into is None:
            return [t.clone() for t in self.tensors(slot)]
        for buffer, t in zip(into, self.tensors(slot), strict=True):
            buffer.copy_(t)
        return into

    def load(self, slot: int, saved: Sequence[torch.Tensor]) -> None:
        for target, value in zip(self.tensors(slot), saved, strict=True):
            target.copy_(value)

    def start(self, slot: int, position: int) -> None:
        """A pass starting at position 0 begins a new sequence: clear the slot. (A captured decode step's
        position is on the device: the layers' kernels start the state afresh there, reading none.)"""
        if position == 0:
            for t in self.tensors(slot):
                t.zero_()

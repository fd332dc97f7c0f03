"""Preallocated KV cache with per-sequence slots.

Layout per layer: [slots, kv_heads, context, head_dim], so a server can run several sequences (one per
slot) against one allocation, and a slot can be rewound (speculation, prefix reuse) by position alone.
Hybrid models allocate KV only for their attention layers and keep the recurrent layers' state beside it
(`recurrent`, per slot too), which snapshots copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gufo.errors import BadInputError
from gufo.kernels.attention import write_entries
from gufo.models.recurrent_state import RecurrentState


@dataclass
class CacheSnapshot:
    """Copies of one slot's first `length` positions in every layer (see `KVCache.snapshot`)."""

    slot: int
    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    recurrent: list[torch.Tensor] | None = None  # the slot's recurrent-layer state, if the model has one


class KVCache:
    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_kv_heads: int,
        context: int,
        key_dim: int,
        value_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        attention_layers: Sequence[int] | None = None,
        recurrent: RecurrentState | None = None,
        scratch: bool = False,
    ):
        """`attention_layers`: the layers that get KV entries (all when None); the others get none.
        `scratch`: one more slot past the n_slots (`scratch_slot`), for the padding rows of a graph
        replay of more rows than a step has (gufo.engine.graphs.rows); no sequence runs there."""
        if scratch and recurrent is not None:
            raise ValueError("a scratch slot holds KV entries only, not recurrent state")
        self.context = context
        self.n_slots = n_slots
        self.scratch_slot = n_slots if scratch else None
        self.recurrent = recurrent
        allocated = n_slots + scratch
        lengths = [
            context if attention_layers is None or layer in attention_layers else 0
            for layer in range(n_layers)
        ]
        self.keys = [
            torch.zeros(allocated, n_kv_heads, length, key_dim, dtype=dtype, device=device)
            for length in lengths
        ]
        self.values = [
            torch.zeros(allocated, n_kv_heads, length, value_dim, dtype=dtype, device=device)
            for length in lengths
        ]

    @property
    def dtype(self) -> torch.dtype:
        """Element type of the keys and values."""
        return self.keys[0].dtype

    def append(
        self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v ([T, kv_heads, dim]) at positions start..; return the slot's [kv_heads, ctx, dim]."""
        end = start + k.shape[0]
        if end > self.context:
            raise BadInputError(f"sequence of {end} tokens exceeds the context size {self.context}")
        keys, values = self.keys[layer][slot], self.values[layer][slot]
        keys[:, start:end] = k.transpose(0, 1)
        values[:, start:end] = v.transpose(0, 1)
        return keys, values

    def entries(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's keys and values of the slot, [kv_heads, ctx, dim] each (views into the cache)."""
        return self.keys[layer][slot], self.values[layer][slot]

    def write(
        self,
        layer: int,
        slot: int,
        index: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        slots: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`append` at positions held on the device (index [T] int64, no bounds check on the host), so
        the write can be captured in a CUDA graph; returns the slot's [kv_heads, ctx, dim]. With `slots`
        ([T] int64, token t's slot) it writes every token into its own slot and returns the layer's
        whole [slots, kv_heads, ctx, dim]."""
        keys, values = self.entries(layer, slot) if slots is None else self.layer_entries(layer)
        write_entries(keys, values, index, k, v, slots)
        return keys, values

    def layer_entries(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's keys and values of every slot, [slots, kv_heads, ctx, dim] each."""
        return self.keys[layer], self.values[layer]

    def snapshot(self, slot: int, length: int) -> CacheSnapshot:
        """Copy positions 0..length of `slot`, so they can be put back after other work used the slot."""
        return CacheSnapshot(
            slot,
            length,
            [k[slot, :, :length].clone() for k in self.keys],
            [v[slot, :, :length].clone() for v in self.values],
            None if self.recurrent is None else self.recurrent.save(slot),
        )

    def copy_prefix(
        self, source: int, target: int, length: int, recurrent: Sequence[torch.Tensor] | None = None
    ) -> None:
        """Copy positions 0..length of every attention layer from slot `source` to slot `target` (one
        device copy per layer's keys and values; none when they are the same slot), so `target`
        continues a prefix `source` computed. A recurrent state holds a whole sequence and cannot be cut
        at `length`: a cache with one takes `recurrent`, the source's state saved (`RecurrentState.save`)
        when it held exactly those `length` tokens, and loads it into `target`."""
        if (self.recurrent is None) != (recurrent is None):
            raise ValueError("a prefix of a cache with recurrent state is copied with its saved state, only")
        if source != target:
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[target, :, :length] = keys[source, :, :length]
                values[target, :, :length] = values[source, :, :length]
        if recurrent is not None:
            self.recurrent.load(target, recurrent)

    def restore(self, state: CacheSnapshot) -> None:
        """Put a snapshot back; positions past its length are stale and get overwritten before any read."""
        for layer, (k, v) in enumerate(zip(state.keys, state.values, strict=True)):
            self.keys[layer][state.slot, :, : state.length] = k
            self.values[layer][state.slot, :, : state.length] = v
        if state.recurrent is not None:
            self.recurrent.load(state.slot, state.recurrent)

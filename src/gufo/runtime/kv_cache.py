"""Preallocated KV cache with per-sequence slots.

Layout per layer: [slots, kv_heads, context, head_dim], so a server can run several sequences (one per
slot) against one allocation, and a slot can be rewound (speculation, prefix reuse) by position alone.
"""

from __future__ import annotations

import torch

from gufo.errors import BadInputError


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
    ):
        self.context = context
        self.n_slots = n_slots
        self.keys = [
            torch.zeros(n_slots, n_kv_heads, context, key_dim, dtype=dtype, device=device)
            for _ in range(n_layers)
        ]
        self.values = [
            torch.zeros(n_slots, n_kv_heads, context, value_dim, dtype=dtype, device=device)
            for _ in range(n_layers)
        ]

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

"""Attention over the KV cache: "attention_prefill" (several queries) and "attention_decode" (one).

Decode reads the KV cache's pages (`gufo.kernels.kv_pages`); the query's position lives in a device
tensor, so the op can run inside a captured CUDA graph: the keys it may see are its slot's entries
0..index (and, with a sliding window, the last `window` of those). Prefill takes one slot's entries in
order. The torch references below are the oracles of the GPU kernels (`gufo.kernels.triton.attention`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gufo.kernels.contracts import (
    ATTENTION_DECODE,
    ATTENTION_PREFILL,
    AttentionDecodeKernel,
    AttentionPrefillKernel,
)
from gufo.kernels.int8_rows import Int8Rows, as_int8_rows
from gufo.kernels.kv_pages import KVPages
from gufo.kernels.registry import REFERENCE_BACKEND, Registration


def visible(span: int, index: torch.Tensor, window: int | None) -> torch.Tensor:
    """[span] bool: which cache entries the query at `index` attends to."""
    seen = torch.arange(span, device=index.device)
    allowed = seen <= index
    if window is not None:
        allowed &= seen > index - window
    return allowed


class ReferenceAttentionDecode(AttentionDecodeKernel):
    name = "torch-attention-decode"

    @staticmethod
    def apply(
        q: torch.Tensor,
        pages: KVPages,
        index: torch.Tensor,
        slots: torch.Tensor | int,
        scale: float,
        window: int | None,
        int8: bool = False,
    ) -> torch.Tensor | Int8Rows:
        """q [T, H, Dk] at cache positions index ([T] int64) of slot slots[t] (or the one slot given),
        each token over exactly the entries 0..index[t] of its slot (any dtype: computed in q's).
        Returns [T, H * Dv] (`int8`: as `Int8Rows`)."""
        positions = index.tolist()
        slot_of = slots.tolist() if isinstance(slots, torch.Tensor) else [slots] * len(positions)
        rows = []
        for t, (slot, position) in enumerate(zip(slot_of, positions, strict=True)):
            keys, values = pages.entries(slot, position + 1)
            rows.append(attend_entries(q[t : t + 1], keys, values, index[t : t + 1], scale, window))
        out = torch.cat(rows)
        return as_int8_rows(out) if int8 else out


def attend_entries(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    index: torch.Tensor,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Decode attention of q [T, H, Dk] at positions index over one slot's entries keys/values [Hkv,
    span, D] (a token sees those up to its position, within the window): [T, H * Dv] in q's dtype."""
    n_tokens, n_kv, span = q.shape[0], keys.shape[0], keys.shape[1]
    # [Hkv, T, G, Dk]: the query heads sharing a KV head are adjacent
    grouped = q.reshape(n_tokens, n_kv, -1, q.shape[-1]).transpose(0, 1)
    scores = torch.matmul(grouped, keys.to(q.dtype).transpose(1, 2)[:, None]) * scale
    seen = visible(span, index[:, None], window)  # [T, span]
    probs = torch.softmax(scores.masked_fill(~seen[:, None], float("-inf")), dim=-1)
    # entries past the position may hold anything (stale drafts, a NaN-filled test cache): not 0 * NaN
    values = torch.where(seen[None, :, :, None], values.to(q.dtype)[:, None], 0.0)
    return torch.matmul(probs, values).transpose(0, 1).reshape(n_tokens, -1)


class ReferenceAttentionPrefill(AttentionPrefillKernel):
    name = "torch-sdpa-masked"

    @staticmethod
    def apply(
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        first: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        """q [T, H, Dk], the last T of the cache entries first..first + S; keys/values [Hkv, S, D].
        Causal (and windowed) GQA attention computed in the cache's dtype: [T, H * Dv] in q's dtype."""
        n_tokens, end = q.shape[0], first + keys.shape[1]
        q_pos = torch.arange(end - n_tokens, end, device=q.device)[:, None]
        k_pos = torch.arange(first, end, device=q.device)[None, :]
        allowed = k_pos <= q_pos
        if window is not None:
            allowed &= k_pos > q_pos - window
        return _sdpa(q, keys, values, allowed, scale)


class FusedAttentionPrefill(AttentionPrefillKernel):
    """GPUs: without a window the mask is causal aligned to the last key, which torch's flash kernel
    takes without a materialised mask, reading the KV heads shared by query heads as they are (GQA;
    docs/decisions.md, "Prefill attention reads grouped KV heads as they are"). Where no fused kernel
    takes GQA, torch materialises the mask (correct, slower). Windowed layers use the reference."""

    name = "torch-sdpa-causal-lower-right"

    @staticmethod
    def apply(
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        first: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:
        if window is not None:
            return ReferenceAttentionPrefill.apply(q, keys, values, first, scale, window)
        # imported here: torch.nn.attention.bias imports torch._dynamo, seconds of CPU that every process
        # importing this module (the CPU engine, `gufo --help` of a command) would pay for a GPU-only kernel
        from torch.nn.attention.bias import causal_lower_right

        return _sdpa(q, keys, values, causal_lower_right(q.shape[0], keys.shape[1]), scale)


def _sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: object, scale: float
) -> torch.Tensor:
    """torch's SDPA on q [T, H, Dk] (cast to the cache's dtype) over keys/values [Hkv, S, D]:
    [T, H * Dv] in q's dtype."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0).to(keys.dtype),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).reshape(q.shape[0], -1).to(q.dtype)


KERNELS = (
    Registration(REFERENCE_BACKEND, ATTENTION_DECODE, ReferenceAttentionDecode()),
    Registration(REFERENCE_BACKEND, ATTENTION_PREFILL, ReferenceAttentionPrefill()),
)  # "cuda"'s attention_prefill (this flash kernel or the tiles) is registered by the Triton catalog

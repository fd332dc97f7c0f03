"""Building blocks shared by the architectures (torch, float32 activations)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gufo.gguf.model_file import ModelFile, TensorInfo
from gufo.kernels import backends, registry  # noqa: F401  (backends registers every kernel)
from gufo.kernels.linear_reference import dequantize_tensor, raw_rows
from gufo.quant import dequantize
from gufo.runtime.kv_cache import KVCache


class Linear:
    """A GGUF weight matrix kept in the layout its kernel wants; the route is recorded for reports.

    Several names of the same type and input width are stacked row-wise into one matrix, so one
    product (and one activation quantization) serves them all.
    """

    def __init__(self, model_file: ModelFile, name: str | list[str], backend: str):
        names = [name] if isinstance(name, str) else name
        infos = [model_file.tensor(n) for n in names]
        info = infos[0] if len(infos) == 1 else stack_rows(infos)
        self.name = info.name
        self.qtype = info.qtype
        self.out_features, self.in_features = info.shape
        self.split_sizes = [i.shape[0] for i in infos]
        self.route, self.kernel = registry.lookup(backend, "linear", info.qtype)
        self.weight = self.kernel.prepare(info)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.apply(x, self.weight)


def stack_rows(infos: list[TensorInfo]) -> TensorInfo:
    first = infos[0]
    rows = np.concatenate([i.data.reshape(-1, i.data.shape[-1]) for i in infos])
    shape = (sum(i.shape[0] for i in infos), first.shape[1])
    return TensorInfo("+".join(i.name for i in infos), first.qtype, shape, -1, rows.nbytes, rows)


class FusedLinear:
    """Weights that read the same input, merged per block format into as few products as possible."""

    def __init__(self, model_file: ModelFile, names: list[str], backend: str):
        by_type: dict[object, list[str]] = {}
        for name in names:
            info = model_file.tensor(name)
            by_type.setdefault((info.qtype, info.shape[1]), []).append(name)
        self.parts = [Linear(model_file, group, backend) for group in by_type.values()]
        grouped = [name for group in by_type.values() for name in group]
        self.order = [grouped.index(name) for name in names]

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        outputs: list[torch.Tensor] = []
        for part in self.parts:
            y = part(x)
            outputs.extend(y.split(part.split_sizes, dim=-1) if len(part.split_sizes) > 1 else [y])
        return [outputs[i] for i in self.order]


class Embedding:
    """Token embedding looked up from the quantized rows (only the requested rows are dequantized).

    On a GPU the raw rows are uploaded once and the lookup dequantizes on the device.
    """

    def __init__(self, model_file: ModelFile, name: str, backend: str):
        self.info = model_file.tensor(name)
        self.device = backends.device_of(backend)
        self.raw = None
        if self.device.type != "cpu":
            self.raw = raw_rows(self.info).to(self.device)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.raw is None:
            return dequantize_tensor(self.info, rows=tokens)
        return dequantize(self.info.qtype, self.raw[tokens.to(self.device)], self.info.shape[-1])


def vector(model_file: ModelFile, name: str) -> torch.Tensor:
    """A small float tensor (norm weights), copied out of the map as float32."""
    return dequantize_tensor(model_file.tensor(name)).reshape(-1)


class RMSNorm:
    """x / rms(x) * weight over the last dimension, by the backend's kernel."""

    def __init__(self, model_file: ModelFile, name: str, eps: float, backend: str):
        self.weight = vector(model_file, name).contiguous().to(backends.device_of(backend))
        self.eps = eps
        self.route, self.kernel = registry.lookup(backend, "rms_norm")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.apply(x, self.weight, self.eps)


@dataclass(frozen=True)
class Rope:
    """Rotary embedding. `neox` rotates halves (x[i], x[i+d/2]); otherwise adjacent pairs (GGML mode 0)."""

    dim: int
    base: float
    neox: bool
    scale: float = 1.0  # linear position scaling (positions are divided by it)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin per rotated column, [T, dim], laid out to match `rotated`."""
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.dim, 2, dtype=torch.float64) / self.dim))
        angles = positions.to(torch.float64)[:, None] / self.scale * inv_freq[None, :]
        cos, sin = angles.cos().to(torch.float32), angles.sin().to(torch.float32)
        if self.neox:
            return torch.cat((cos, cos), -1), torch.cat((-sin, sin), -1)
        return cos.repeat_interleave(2, -1), torch.stack((-sin, sin), -1).flatten(-2)

    def rotated(self, x: torch.Tensor) -> torch.Tensor:
        """The partner of each column: (x2, x1) halves for NeoX, swapped adjacent pairs otherwise."""
        if self.neox:
            half = self.dim // 2
            return torch.cat((x[..., half:], x[..., :half]), -1)
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos/sin from `tables`."""
        cos, sin = cos[:, None, :], sin[:, None, :]
        if self.dim == x.shape[-1]:
            return x * cos + self.rotated(x) * sin
        rot, rest = x[..., : self.dim], x[..., self.dim :]
        return torch.cat((rot * cos + self.rotated(rot) * sin, rest), -1)


@dataclass(frozen=True)
class DevicePosition:
    """A one-token decode position held on the device, so a captured CUDA graph can replay at any
    position: `index` ([1], int64) is read by the kernels, `span` (host int > index) bounds the cache
    prefix attention reads; one graph serves every position below its span."""

    index: torch.Tensor
    span: int


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    layer: int,
    slot: int,
    start_pos: int | DevicePosition,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Causal (optionally sliding-window) GQA attention over the cache after appending k, v.

    q: [T, H, D]; k, v: [T, Hkv, D]. Returns [T, H * D].
    """
    if isinstance(start_pos, DevicePosition):
        return _attention_at(q, k, v, cache, layer, slot, start_pos, scale, window)
    n_tokens = q.shape[0]
    keys, values = cache.append(layer, slot, start_pos, k, v)
    end = start_pos + n_tokens
    first = 0 if window is None else max(0, end - n_tokens - window + 1)
    keys, values = keys[:, first:end], values[:, first:end]
    if n_tokens == 1:
        # Decode: one query per head sees exactly keys[first:end]; grouped heads share a KV head, so
        # two small batched products beat the general kernel's setup cost.
        n_kv = keys.shape[0]
        grouped = q.reshape(n_kv, -1, q.shape[-1])
        probs = torch.softmax(torch.matmul(grouped, keys.transpose(1, 2)) * scale, dim=-1)
        return torch.matmul(probs, values).reshape(1, -1)
    q_pos = torch.arange(start_pos, end, device=q.device)[:, None]
    k_pos = torch.arange(first, end, device=q.device)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),
        keys.unsqueeze(0),
        values.unsqueeze(0),
        attn_mask=allowed,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).reshape(n_tokens, -1)


def _attention_at(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    layer: int,
    slot: int,
    position: DevicePosition,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """One-token attention without host-side positions: the KV write and the causal/window mask read
    `position.index` on the device, over the first `position.span` cache entries."""
    keys, values = cache.keys[layer][slot], cache.values[layer][slot]
    keys.index_copy_(1, position.index, k.transpose(0, 1).to(keys.dtype))
    values.index_copy_(1, position.index, v.transpose(0, 1).to(values.dtype))
    keys, values = keys[:, : position.span], values[:, : position.span]
    seen = torch.arange(position.span, device=q.device)
    hidden = seen > position.index
    if window is not None:
        hidden |= seen <= position.index - window
    grouped = q.reshape(keys.shape[0], -1, q.shape[-1])
    scores = torch.matmul(grouped, keys.transpose(1, 2)) * scale
    probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return torch.matmul(probs, values).reshape(1, -1)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Gated-FFN activations by name (the fused decode kernels implement the same names).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu, "gelu_tanh": gelu_tanh}


def default_attention_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)

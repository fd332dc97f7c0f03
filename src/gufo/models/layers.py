"""Building blocks shared by the architectures (torch, float32 activations)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from gufo.errors import BadInputError
from gufo.formats import dequantize
from gufo.gguf.model_file import ModelFile, TensorInfo
from gufo.kernels import backends, registry
from gufo.kernels.contracts import (
    ADD_RMS_NORM,
    ATTENTION_DECODE,
    ATTENTION_PREFILL,
    GATED_RMS_NORM,
    LINEAR,
    RMS_NORM,
    AttentionDecodeKernel,
    AttentionPrefillKernel,
    FusedProductSpec,
    Op,
    ProductSpec,
)
from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.kv_pages import KVPages
from gufo.kernels.linear_reference import dequantize_tensor, raw_rows
from gufo.kernels.pointwise import ACTIVATIONS, gelu_tanh  # noqa: F401  (the models' activation names)
from gufo.kernels.positions import TokenPositions
from gufo.kernels.registry import KernelType
from gufo.models.kv_cache import KVCache


class Linear:
    """A GGUF weight matrix kept in the layout its kernel wants, plus its bias when the file has one
    (`<name>.bias` beside `<name>.weight`); the route is recorded for reports.

    Several names of the same type and input width are stacked row-wise into one matrix, so one
    product (and one activation quantization) serves them all. `split_sizes` gives the rows of each
    named matrix (a fused file tensor such as attn_qkv may name several).
    """

    def __init__(self, model_file: ModelFile, name: str | list[str], backend: str):
        names = [name] if isinstance(name, str) else name
        infos = [model_file.tensor(n) for n in names]
        bias = stacked_bias([i.shape[0] for i in infos], [bias_of(model_file, n) for n in names])
        self._load(infos, backend, bias)

    @classmethod
    def of(
        cls,
        infos: list[TensorInfo],
        backend: str,
        bias: torch.Tensor | None = None,
        split_sizes: list[int] | None = None,
    ) -> Linear:
        """A Linear of tensors the file does not name on their own (slices of a 3-D expert tensor)."""
        linear = cls.__new__(cls)
        linear._load(infos, backend, bias, split_sizes)
        return linear

    def _load(
        self,
        infos: list[TensorInfo],
        backend: str,
        bias: torch.Tensor | None,
        split_sizes: list[int] | None = None,
    ) -> None:
        info = infos[0] if len(infos) == 1 else stack_rows(infos)
        self.name = info.name
        self.qtype = info.qtype
        self.out_features, self.in_features = info.shape
        self.split_sizes = split_sizes or [i.shape[0] for i in infos]
        self.route, self.kernel = registry.lookup(backend, LINEAR, info.qtype)
        self.weight = self.kernel.prepare(info)
        self.bias = None if bias is None else bias.to(backends.device_of(backend))
        # Tensor parallelism sets a collective on a shard's partial output (gufo.parallel.model); the
        # bias is added after it, once.
        self.after: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor | Int8Rows) -> torch.Tensor:
        y = self.kernel.apply(x, self.weight)
        y = y if self.after is None else self.after(y)
        return y if self.bias is None else y + self.bias

    def takes_int8(self, rows: int) -> bool:
        """Whether this product of `rows` rows may be given them as `Int8Rows` (the kernel that makes
        them quantizes as it writes: one launch fewer)."""
        return self.kernel.takes_int8(self.weight, rows)

    def keeps_rows(self, rows: int) -> bool:
        """Whether this product of `rows` rows gives each row the numbers of its own one-row product."""
        return self.kernel.keeps_rows(self.weight, rows)

    def packs_rows(self) -> bool:
        """Whether its prefill rows keep their numbers at any row count (`LinearKernel.packs_rows`)."""
        return self.kernel.packs_rows(self.weight)

    def spec(self) -> ProductSpec:
        """This product as data, for fused kernels."""
        return ProductSpec(
            self.kernel,
            self.route,
            self.weight,
            self.out_features,
            self.in_features,
            tuple(self.split_sizes),
            has_bias=self.bias is not None,
            has_collective=self.after is not None,
        )


def bias_of(model_file: ModelFile, weight_name: str) -> TensorInfo | None:
    """The bias the file stores beside a weight matrix (`X.bias` for `X.weight`), if any."""
    stem = weight_name.removesuffix(".weight")
    return model_file.optional_tensor(f"{stem}.bias") if stem != weight_name else None


def stacked_bias(rows: list[int], biases: list[TensorInfo | None]) -> torch.Tensor | None:
    """The biases of row-stacked matrices of `rows` rows each as one float32 vector (zeros for a
    matrix without one), or None when none has a bias."""
    if all(b is None for b in biases):
        return None
    parts = []
    for n, bias in zip(rows, biases, strict=True):
        if bias is not None and bias.n_elements != n:
            raise BadInputError(f"tensor {bias.name} has {bias.n_elements} values, expected {n}")
        parts.append(torch.zeros(n) if bias is None else dequantize_tensor(bias).reshape(-1))
    return torch.cat(parts).contiguous()


def stack_rows(infos: list[TensorInfo]) -> TensorInfo:
    first = infos[0]
    rows = np.concatenate([i.data.reshape(-1, i.data.shape[-1]) for i in infos])
    shape = (sum(i.shape[0] for i in infos), first.shape[1])
    return TensorInfo("+".join(i.name for i in infos), first.qtype, shape, -1, rows.nbytes, rows)


class FusedLinear:
    """Weights that read the same input, merged per block format into as few products as possible."""

    def __init__(self, model_file: ModelFile, names: list[str], backend: str):
        infos = [model_file.tensor(name) for name in names]
        self._fuse(infos, backend, [bias_of(model_file, name) for name in names])

    @classmethod
    def of(cls, infos: list[TensorInfo], backend: str) -> FusedLinear:
        fused = cls.__new__(cls)
        fused._fuse(infos, backend, [None] * len(infos))
        return fused

    @classmethod
    def split(
        cls, model_file: ModelFile, name: str, split_sizes: list[int], backend: str, biases: list[str]
    ) -> FusedLinear:
        """One file tensor that stacks several matrices (e.g. attn_qkv, written by the converter's
        --fuse-qkv) in one product, its output split by rows; its bias is `<name>.bias`, or else the
        parts' own `biases` (names, each optional)."""
        info = model_file.tensor(name)
        if info.shape[0] != sum(split_sizes):
            raise BadInputError(
                f"{model_file.label}: tensor {name} has {info.shape[0]} rows, expected {sum(split_sizes)}"
            )
        whole = bias_of(model_file, name)
        if whole is not None:
            bias = stacked_bias([info.shape[0]], [whole])
        else:
            bias = stacked_bias(split_sizes, [model_file.optional_tensor(b) for b in biases])
        return cls.stacked(info, split_sizes, backend, bias)

    @classmethod
    def stacked(
        cls, info: TensorInfo, split_sizes: list[int], backend: str, bias: torch.Tensor | None = None
    ) -> FusedLinear:
        """One matrix whose rows stack the named matrices of `split_sizes` rows (one product)."""
        fused = cls.__new__(cls)
        fused.parts = [Linear.of([info], backend, bias, split_sizes)]
        fused.order = list(range(len(split_sizes)))
        return fused

    def _fuse(self, infos: list[TensorInfo], backend: str, biases: list[TensorInfo | None]) -> None:
        by_type: dict[object, list[int]] = {}
        for i, info in enumerate(infos):
            by_type.setdefault((info.qtype, info.shape[1]), []).append(i)
        self.parts = []
        for group in by_type.values():
            bias = stacked_bias([infos[i].shape[0] for i in group], [biases[i] for i in group])
            self.parts.append(Linear.of([infos[i] for i in group], backend, bias))
        grouped = [i for group in by_type.values() for i in group]
        self.order = [grouped.index(i) for i in range(len(infos))]

    def takes_int8(self, rows: int) -> bool:
        return all(part.takes_int8(rows) for part in self.parts)

    def spec(self) -> FusedProductSpec:
        return FusedProductSpec(tuple(part.spec() for part in self.parts), tuple(self.order))

    def __call__(self, x: torch.Tensor | Int8Rows) -> list[torch.Tensor]:
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
        self.route, self.kernel = registry.lookup(backend, RMS_NORM)
        self.fused_add = own_kernel(backend, ADD_RMS_NORM)
        self.fused_gate = own_kernel(backend, GATED_RMS_NORM)

    def __call__(self, x: torch.Tensor, int8: bool = False) -> torch.Tensor | Int8Rows:
        """The norm of x; with `int8` (only where the consumer `takes_int8`), as `Int8Rows`."""
        if int8:
            return self.kernel.apply(x, self.weight, self.eps, int8=True)
        return self.kernel.apply(x, self.weight, self.eps)

    def after_add(
        self, x: torch.Tensor, h: torch.Tensor, int8: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | Int8Rows]:
        """(x + h, the norm of x + h): one pass where the backend fuses them (a residual add and the
        next pre-norm), else the add and this norm's kernel. `int8` as in __call__."""
        if self.fused_add is not None:
            if int8:
                return self.fused_add.apply(x, h, self.weight, self.eps, int8=True)
            return self.fused_add.apply(x, h, self.weight, self.eps)
        total = x + h
        return total, self(total, int8)

    def gated(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The norm of x times silu(z): one pass where the backend fuses them (a Gated DeltaNet's output
        gate), else this norm's kernel and the torch gate."""
        if self.fused_gate is not None:
            return self.fused_gate.apply(x, z, self.weight, self.eps)
        return self(x) * F.silu(z)


def rows_of(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


class Int8Consumer(Protocol):
    """A module that reads rows (a product, an FFN, a token mixer) and says whether it takes them as
    `Int8Rows` (quantized by the kernel that writes them: one launch fewer)."""

    def takes_int8(self, rows: int) -> bool: ...


def takes_int8(consumer: Int8Consumer, x: torch.Tensor) -> bool:
    return consumer.takes_int8(rows_of(x))


def own_kernel(backend: str, op: Op[KernelType]) -> KernelType | None:
    """The backend's own kernel for an optional fused op, or None where only the torch reference has it
    (the caller then composes the unfused kernels, which keeps that backend's numbers as they were)."""
    found = registry.find(backend, op)
    return found[1] if found is not None and found[0] == backend else None


@dataclass(frozen=True)
class DevicePosition:
    """Decode positions held on the device, so a captured CUDA graph replays at any position: `index`
    ([T] int64, consecutive) is read by the kernels, which attend each token over the span its own
    one-token step reads (decode attention bounds it by the position on the device). With `slots`
    ([T] int64) token t is the next token of the sequence in cache slot slots[t] at position index[t]:
    one decode step of several sequences (the slot the pass is given is then not read)."""

    index: torch.Tensor
    slots: torch.Tensor | None = None


@dataclass(frozen=True)
class AttentionKernels:
    """A backend's "attention_prefill" and "attention_decode" kernels, resolved once per layer, and the
    backend the prefill kernel was found on (the torch reference where the backend has none: reports)."""

    prefill: AttentionPrefillKernel
    decode: AttentionDecodeKernel
    prefill_route: str

    @classmethod
    def of(cls, backend: str) -> AttentionKernels:
        prefill_route, prefill = registry.lookup(backend, ATTENTION_PREFILL)
        return cls(prefill, registry.lookup(backend, ATTENTION_DECODE)[1], prefill_route)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: KVCache,
    layer: int,
    slot: int,
    start_pos: int | DevicePosition | TokenPositions,
    scale: float,
    window: int | None,
    kernels: AttentionKernels,
) -> torch.Tensor:
    """Causal (optionally sliding-window) GQA attention over the cache after writing k, v there.

    q: [T, H, D]; k, v: [T, Hkv, D]. Returns [T, H * D].
    """
    if isinstance(start_pos, DevicePosition):
        cache.write(layer, slot, start_pos.index, k, v, start_pos.slots)
        return attend_written(q, cache.pages(layer), slot, start_pos, scale, window, kernels.decode)
    n_tokens = q.shape[0]
    per_token = isinstance(start_pos, TokenPositions) or n_tokens == 1
    if isinstance(start_pos, TokenPositions):
        start_pos = start_pos.start
    cache.append(layer, slot, start_pos, k, v)
    end = start_pos + n_tokens
    if per_token:  # decode: each token the one-token op over its slot's entries (it applies the window)
        index = torch.arange(start_pos, end, device=q.device)
        return kernels.decode.apply(q, cache.pages(layer), index, slot, scale, window).to(q.dtype)
    keys, values = cache.entries(layer, slot, end)
    return attend_cached(q, keys, values, end, scale, window, kernels.prefill)


def attend_cached(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    end: int,
    scale: float,
    window: int | None,
    prefill: AttentionPrefillKernel,
) -> torch.Tensor:
    """Prefill attention of q ([T, H, D], the tokens at cache positions end - T..end - 1) over a slot's
    cache entries keys/values ([Hkv, end, D], already holding those tokens): [T, H * Dv]."""
    first = 0 if window is None else max(0, end - q.shape[0] - window + 1)
    return prefill.apply(q, keys[:, first:end], values[:, first:end], first, scale, window)


def attend_written(
    q: torch.Tensor,
    pages: KVPages,
    slot: int,
    position: DevicePosition,
    scale: float,
    window: int | None,
    decode: AttentionDecodeKernel,
    int8: bool = False,
) -> torch.Tensor | Int8Rows:
    """Decode attention of q ([T, H, D]) at device positions over the cache pages (already holding the
    tokens' entries) of `slot`, or of each row's slot with `position.slots`: each token's span is bounded
    on the device. `int8`: as `Int8Rows` (the op quantizes as it writes)."""
    slots = slot if position.slots is None else position.slots
    out = decode.apply(q, pages, position.index, slots, scale, window, int8)
    return out if int8 else out.to(q.dtype)


def attention_scale(mf: ModelFile, head_dim: int) -> float:
    """The file's `attention.scale`, else 1 / sqrt(head_dim)."""
    return float(mf.arch_key("attention.scale", 0.0)) or 1.0 / math.sqrt(head_dim)

"""The "decode_layer" op: the fused CPU kernel (csrc/decode_cpu.c), which runs a whole decoder layer.

At decode a layer is ~35 tiny torch ops whose interpreter cost exceeds their work; the CPU kernel runs
the whole layer in one C call. It reads the layers as `LayerSpec`s and takes them when every product
runs on the int8 CPU kernel. It is batch-invariant: it also takes consecutive tokens at once and gives
each the numbers a one-token call would, so speculative verification reads the weights once for all
drafted tokens without changing greedy output, and the CPU engine prefills prompts through it too (a
token's numbers never depend on how its prompt was chunked or what was cached: docs/decisions.md).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gufo.errors import BadInputError
from gufo.kernels.contracts import (
    DECODE_LAYER,
    DecodeLayerKernel,
    FusedProductSpec,
    KVCacheView,
    LayerSpec,
    ProductSpec,
)
from gufo.kernels.cpu_int8 import CpuInt8Linear, Int8Weight, library
from gufo.kernels.positions import RowPositions
from gufo.kernels.registry import Registration

ACT_CODES = ("silu", "gelu_tanh")  # index = the C kernel's ACT_* value


_f32, _i32, _ptr = ctypes.c_float, ctypes.c_int32, ctypes.c_void_p


class PartStruct(ctypes.Structure):
    _fields_ = [
        ("q", _ptr),
        ("scale", _ptr),
        ("offset", _ptr),
        ("out", _ptr),
        ("rows", _i32),
        ("group", _i32),
        ("kind", _i32),
    ]


class DecodeLayerStruct(ctypes.Structure):
    """Mirrors gufo_layer in csrc/decode_cpu.c."""

    _fields_ = [
        *((n, _i32) for n in ("n_embd", "n_heads", "n_kv_heads", "key_dim", "value_dim", "n_ff")),
        *((n, _i32) for n in ("rope_dim", "rope_neox", "act", "window")),
        ("eps", _f32),
        ("attn_scale", _f32),
        *(
            (n, _ptr)
            for n in ("attn_norm", "q_norm", "k_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm")
        ),
        ("n_qkv", _i32),
        ("n_gate_up", _i32),
        ("qkv", PartStruct * 3),
        ("o", PartStruct),
        ("gate_up", PartStruct * 2),
        ("down", PartStruct),
        *((n, _ptr) for n in ("q", "k", "v", "gate", "up", "xn", "attn", "h", "act_out")),
        *((n, _ptr) for n in ("xq", "xs", "xsum16", "xsum32")),
        ("ld_qkv", _i32),
        ("ld_gate_up", _i32),
    ]


@dataclass
class CpuDecodePlan:
    structs: list[DecodeLayerStruct]
    scratch: list[torch.Tensor]  # what the structs point into, kept alive here
    rows: int  # tokens the scratch holds; longer calls run in chunks of this many
    scores: torch.Tensor  # attention scores, context floats per thread, grown on demand


def _ptr_of(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _part(product: ProductSpec, out: int) -> PartStruct:
    w: Int8Weight = product.weight
    return PartStruct(
        w.q.data_ptr(), w.scale.data_ptr(), _ptr_of(w.offset), out, product.out_features, w.group, w.kind
    )


def _fused_parts(fused: FusedProductSpec, out: int) -> tuple[list[PartStruct], list[int]]:
    """Parts writing one after another into float32s at `out`, and the address of each named matrix's rows."""
    parts, starts, offset = [], [], 0
    for product in fused.parts:
        parts.append(_part(product, out + 4 * offset))
        for size in product.split_sizes:
            starts.append(offset)
            offset += size
    return parts, [out + 4 * starts[i] for i in fused.order]


def _products(spec: LayerSpec) -> list[ProductSpec]:
    return [*spec.qkv.parts, spec.o, *spec.gate_up.parts, spec.down]


def _runs_here(product: ProductSpec) -> bool:
    """An int8 CPU product with nothing between it and the next step of the layer."""
    return (
        isinstance(product.kernel, CpuInt8Linear)
        and product.route == "cpu"
        and not product.has_bias
        and not product.has_collective
    )


class CpuDecodeLayer(DecodeLayerKernel):
    name = "cpu-fused-layer"
    batch_invariant = True
    multi_slot = True
    # scratch capacity in tokens: a prompt chunk of up to 64 tokens (or a verification of up to 63 drafts)
    # runs in one call; 16 made CPU prefill through this kernel ~25% slower than the torch layers, 64
    # as fast (docs/decisions.md, "CPU prefill runs the fused decode layer")
    rows = 64

    @staticmethod
    def available() -> bool:
        return library() is not None

    @staticmethod
    def prepare(specs: list[LayerSpec]) -> CpuDecodePlan | None:
        """The C structs of every layer over shared scratch; None when a layer has a product this kernel
        cannot run (a float or unsupported weight, a bias), an activation it does not know, or a
        collective between its products (a tensor-parallel shard: the torch layer runs it per rank)."""
        for spec in specs:
            if spec.activation not in ACT_CODES or not all(_runs_here(p) for p in _products(spec)):
                return None
        # Layers run one after another, so they share one set of scratch vectors (kept hot in cache), each
        # with room for `rows` tokens.
        scratch: list[torch.Tensor] = []
        rows = CpuDecodeLayer.rows

        def buffer(n: int, dtype: torch.dtype = torch.float32) -> int:
            scratch.append(torch.zeros(rows * n, dtype=dtype))
            return scratch[-1].data_ptr()

        def widest(get: Callable[[LayerSpec], int]) -> int:
            return max(get(spec) for spec in specs)

        first = specs[0]
        k_max = widest(lambda spec: max(p.in_features for p in _products(spec)))
        xq, xs, xsum16, xsum32 = (
            buffer(k_max, torch.int8),
            buffer(k_max // 32),
            buffer(k_max // 16),
            buffer(k_max // 32),
        )
        ld_qkv = widest(lambda spec: sum(p.out_features for p in spec.qkv.parts))
        ld_gate_up = widest(lambda spec: sum(p.out_features for p in spec.gate_up.parts))
        qkv_out, gate_up_out = buffer(ld_qkv), buffer(ld_gate_up)
        xn, h = buffer(first.n_embd), buffer(first.n_embd)
        attn_out, act_out = (
            buffer(widest(lambda spec: spec.o.in_features)),
            buffer(widest(lambda spec: spec.down.in_features)),
        )
        structs = []
        for spec in specs:
            qkv_parts, (q, k, v) = _fused_parts(spec.qkv, qkv_out)
            gu_parts, (gate, up) = _fused_parts(spec.gate_up, gate_up_out)
            structs.append(
                DecodeLayerStruct(
                    spec.n_embd,
                    spec.n_heads,
                    spec.n_kv_heads,
                    spec.key_dim,
                    spec.value_dim,
                    spec.down.in_features,
                    spec.rope_dim,
                    int(spec.rope_neox),
                    ACT_CODES.index(spec.activation),
                    spec.window or 0,
                    spec.eps,
                    spec.attn_scale,
                    spec.attn_norm.data_ptr(),
                    _ptr_of(spec.q_norm),
                    _ptr_of(spec.k_norm),
                    _ptr_of(spec.post_attn_norm),
                    spec.ffn_norm.data_ptr(),
                    _ptr_of(spec.post_ffn_norm),
                    len(qkv_parts),
                    len(gu_parts),
                    (PartStruct * 3)(*qkv_parts),
                    _part(spec.o, h),
                    (PartStruct * 2)(*gu_parts),
                    _part(spec.down, h),
                    q,
                    k,
                    v,
                    gate,
                    up,
                    xn,
                    attn_out,
                    h,
                    act_out,
                    xq,
                    xs,
                    xsum16,
                    xsum32,
                    ld_qkv,
                    ld_gate_up,
                )
            )
        return CpuDecodePlan(structs, scratch, rows, torch.empty(0))

    @staticmethod
    def apply(
        plan: CpuDecodePlan,
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCacheView,
        slot: int,
        start_pos: int | RowPositions,
    ) -> torch.Tensor:
        """x: [M, n_embd], tokens at positions start_pos..start_pos + M - 1 of `slot`, or row i at
        start_pos.positions[i] of slot start_pos.slots[i]; rope_tables: [M, rope_dim]."""
        n_tokens = x.shape[0]
        if isinstance(start_pos, RowPositions):
            slots, positions = start_pos.slots, start_pos.positions
        else:
            slots, positions = (slot,) * n_tokens, tuple(range(start_pos, start_pos + n_tokens))
        if max(positions) >= cache.context:
            longest = max(positions) + 1
            raise BadInputError(f"sequence of {longest} tokens exceeds the context size {cache.context}")
        pages = cache.pages(index)
        keys, values, table = pages.keys, pages.values, pages.table
        if keys.dtype != torch.float32 or not (keys.is_contiguous() and values.is_contiguous()):
            raise TypeError("the CPU decode kernel needs a contiguous float32 KV cache")
        if table.dtype != torch.int64 or not table.is_contiguous():
            raise TypeError("the CPU decode kernel needs a contiguous int64 page table")
        threads = torch.get_num_threads()  # the C kernel's team: the OpenMP pool torch sized
        if plan.scores.numel() < threads * cache.context:
            plan.scores = torch.empty(threads * cache.context)
        cos, sin = (t.contiguous() for t in rope_tables)
        out = x.contiguous().clone()
        for begin in range(0, n_tokens, plan.rows):
            rows = range(begin, min(begin + plan.rows, n_tokens))
            library().gufo_decode_layer(
                ctypes.addressof(plan.structs[index]),
                len(rows),
                out[begin].data_ptr(),
                cos[begin].data_ptr(),
                sin[begin].data_ptr(),
                keys.data_ptr(),
                values.data_ptr(),
                keys.shape[1],
                keys.shape[2],
                (_ptr * len(rows))(*(table[slots[i]].data_ptr() for i in rows)),
                cache.context,
                (_i32 * len(rows))(*(positions[i] for i in rows)),
                plan.scores.data_ptr(),
                threads,
            )
        return out


KERNELS = (Registration("cpu", DECODE_LAYER, CpuDecodeLayer()),)

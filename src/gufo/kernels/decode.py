"""The "decode_layer" op: the torch layer (reference) and the fused CPU kernel (csrc/decode_cpu.c).

At decode a layer is ~35 tiny torch ops whose interpreter cost exceeds their work; the CPU kernel runs
the whole layer in one C call. It takes a model whose every product runs on the int8 CPU kernel.
A kernel with `batch_invariant = True` also takes a few consecutive tokens at once and gives each the
numbers a one-token call would: speculative verification reads the weights once for all drafted tokens
without changing greedy output. The torch layer's multi-token path (prefill) is not batch-invariant.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gufo.errors import BadInputError
from gufo.kernels.attention import RowPositions, TokenPositions
from gufo.kernels.cpu_int8 import CpuInt8Linear, Int8Weight, library
from gufo.kernels.registry import REFERENCE_BACKEND, register

if TYPE_CHECKING:
    from gufo.models.base import DecoderLayer
    from gufo.models.kv_cache import KVCache
    from gufo.models.layers import FusedLinear, Linear

ACT_CODES = ("silu", "gelu_tanh")  # index = the C kernel's ACT_* value


@register(REFERENCE_BACKEND, "decode_layer")
class ReferenceDecodeLayer:
    name = "torch-layer"
    batch_invariant = False

    @staticmethod
    def prepare(layers: list[DecoderLayer]) -> list[DecoderLayer]:
        return layers

    @staticmethod
    def apply(
        plan: list[DecoderLayer],
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        slot: int,
        start_pos: int,
    ) -> torch.Tensor:
        return plan[index](x, rope_tables, cache, index, slot, start_pos)


@register("cuda", "decode_layer")
class DeviceDecodeLayer(ReferenceDecodeLayer):
    """GPUs: the torch layer on the backend's kernels, batch-invariant up to `max_tokens` tokens: the
    products of up to 16 rows run the skinny kernels with each row's M = 1 arithmetic, the norms,
    RoPE and activation are row-wise kernels, and each token attends through the one-token op over
    the span its own decode step reads (TokenPositions), so speculative verification gives the
    graph-replayed decode steps' logits bit for bit."""

    name = "torch-layer-per-token"
    batch_invariant = True
    max_tokens = 16  # the skinny products' row limit (gufo.kernels.triton.gemv.MAX_BLOCK_M)

    @staticmethod
    def apply(
        plan: list[DecoderLayer],
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        slot: int,
        start_pos: int,
    ) -> torch.Tensor:
        if isinstance(start_pos, int) and x.shape[0] > 1:
            start_pos = TokenPositions(start_pos)
        # each layer's last residual add goes into the next layer's pre-norm kernel (one launch fewer);
        # the last layer adds its own
        defer = index + 1 < len(plan)
        return plan[index](x, rope_tables, cache, index, slot, start_pos, defer)


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
    n_heads: int
    rows: int  # tokens the scratch holds; longer calls run in chunks of this many
    scores: torch.Tensor  # attention scores, rows * n_heads * context floats, grown on demand


def _ptr_of(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _part(linear: Linear, out: int) -> PartStruct:
    w: Int8Weight = linear.weight
    return PartStruct(
        w.q.data_ptr(), w.scale.data_ptr(), _ptr_of(w.offset), out, linear.out_features, w.group, w.kind
    )


def _fused_parts(fused: FusedLinear, out: int) -> tuple[list[PartStruct], list[int]]:
    """Parts writing one after another into float32s at `out`, and the address of each named matrix's rows."""
    parts, starts, offset = [], [], 0
    for linear in fused.parts:
        parts.append(_part(linear, out + 4 * offset))
        for size in linear.split_sizes:
            starts.append(offset)
            offset += size
    return parts, [out + 4 * starts[i] for i in fused.order]


def _linears(layer: DecoderLayer) -> list[Linear]:
    return [*layer.attn.qkv.parts, layer.attn.o, *layer.ffn.gate_up.parts, layer.ffn.down]


@register("cpu", "decode_layer")
class CpuDecodeLayer:
    name = "cpu-fused-layer"
    batch_invariant = True
    multi_slot = True  # takes RowPositions: several sequences' decode steps in one call
    rows = 16  # scratch capacity in tokens: a verification of up to 15 drafts runs in one call

    @staticmethod
    def available() -> bool:
        return library() is not None

    @staticmethod
    def prepare(layers: list[DecoderLayer]) -> CpuDecodePlan | None:
        """The C structs of every layer over shared scratch; None when a layer has a product this kernel
        cannot run (a float or unsupported weight, a bias), an activation it does not know, or a
        collective between its products (a tensor-parallel shard: the torch layer runs it per rank)."""
        for layer in layers:
            if layer.ffn.act_name not in ACT_CODES or any(
                lin.kernel is not CpuInt8Linear
                or lin.route != "cpu"
                or getattr(lin, "after", None) is not None
                or getattr(lin, "bias", None) is not None
                for lin in _linears(layer)
            ):
                return None
        # Layers run one after another, so they share one set of scratch vectors (kept hot in cache), each
        # with room for `rows` tokens.
        scratch: list[torch.Tensor] = []
        rows = CpuDecodeLayer.rows

        def buffer(n: int, dtype: torch.dtype = torch.float32) -> int:
            scratch.append(torch.zeros(rows * n, dtype=dtype))
            return scratch[-1].data_ptr()

        def widest(get: Callable[[DecoderLayer], int]) -> int:
            return max(get(layer) for layer in layers)

        cfg = layers[0].attn.cfg
        k_max = widest(lambda layer: max(lin.in_features for lin in _linears(layer)))
        xq, xs, xsum16, xsum32 = (
            buffer(k_max, torch.int8),
            buffer(k_max // 32),
            buffer(k_max // 16),
            buffer(k_max // 32),
        )
        ld_qkv = widest(lambda layer: sum(p.out_features for p in layer.attn.qkv.parts))
        ld_gate_up = widest(lambda layer: sum(p.out_features for p in layer.ffn.gate_up.parts))
        qkv_out, gate_up_out = buffer(ld_qkv), buffer(ld_gate_up)
        xn, h = buffer(cfg.n_embd), buffer(cfg.n_embd)
        attn_out, act_out = (
            buffer(widest(lambda layer: layer.attn.o.in_features)),
            buffer(widest(lambda layer: layer.ffn.down.in_features)),
        )
        structs = []
        for layer in layers:
            attn, ffn = layer.attn, layer.ffn
            qkv_parts, (q, k, v) = _fused_parts(attn.qkv, qkv_out)
            gu_parts, (gate, up) = _fused_parts(ffn.gate_up, gate_up_out)
            structs.append(
                DecodeLayerStruct(
                    cfg.n_embd,
                    cfg.n_heads,
                    cfg.n_kv_heads,
                    cfg.key_dim,
                    cfg.value_dim,
                    ffn.down.in_features,
                    attn.rope.dim,
                    int(attn.rope.neox),
                    ACT_CODES.index(ffn.act_name),
                    attn.window or 0,
                    cfg.rms_eps,
                    attn.scale,
                    layer.attn_norm.weight.data_ptr(),
                    _ptr_of(attn.q_norm.weight if attn.q_norm else None),
                    _ptr_of(attn.k_norm.weight if attn.k_norm else None),
                    _ptr_of(layer.post_attn_norm.weight if layer.post_attn_norm else None),
                    layer.ffn_norm.weight.data_ptr(),
                    _ptr_of(layer.post_ffn_norm.weight if layer.post_ffn_norm else None),
                    len(qkv_parts),
                    len(gu_parts),
                    (PartStruct * 3)(*qkv_parts),
                    _part(attn.o, h),
                    (PartStruct * 2)(*gu_parts),
                    _part(ffn.down, h),
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
        return CpuDecodePlan(structs, scratch, cfg.n_heads, rows, torch.empty(0))

    @staticmethod
    def apply(
        plan: CpuDecodePlan,
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
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
        keys, values = cache.keys[index], cache.values[index]
        if keys.dtype != torch.float32 or not (keys.is_contiguous() and values.is_contiguous()):
            raise TypeError("the CPU decode kernel needs a contiguous float32 KV cache")
        if plan.scores.numel() < plan.rows * plan.n_heads * cache.context:
            plan.scores = torch.empty(plan.rows * plan.n_heads * cache.context)
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
                (_ptr * len(rows))(*(keys[slots[i]].data_ptr() for i in rows)),
                (_ptr * len(rows))(*(values[slots[i]].data_ptr() for i in rows)),
                cache.context,
                (_i32 * len(rows))(*(positions[i] for i in rows)),
                plan.scores.data_ptr(),
            )
        return out

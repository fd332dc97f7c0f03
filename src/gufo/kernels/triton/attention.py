"""Decode attention over the KV cache: each query token attends to the cache up to its own position,
split across the context ("flash decoding").

A decode step has one query row per head, so a kernel per KV head alone would leave most of the GPU
idle at long depths. `attention_decode_split` gives each program one token, one KV head and one range
of cache entries: it reads that range's keys and values once for all the query heads sharing the KV
head (GQA), keeps a running maximum and sum (online softmax) in float32, and writes its partial
result; `attention_decode_combine` rescales and adds the partials per head. The cache may be float16
(what the GPU engine stores) or float32; the arithmetic is float32 either way.

Each token's position is read from a device tensor, and so is the span of the cache it reads
(`decode_span`: whole SPAN_STEP blocks up to the position) and how that span is cut into ranges. The
launch shape depends on the head layout alone, so one captured CUDA graph serves every position, and a
token gives the same numbers whether it runs alone or among drafted tokens (speculative verification).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gufo.kernels.attention import SPAN_STEP, decode_span
from gufo.kernels.registry import register

ELEMENTS_PER_STEP = 8192  # GROUP x BLOCK_T x head_dim products per loop step (register budget)
NUM_WARPS = 4
# At most this many context ranges per KV head: the combine kernel holds SPLITS x head_dim partials per
# program, and 256 x 256 spilled registers on sm_90 and gfx1151 (`gufo kernels own`).
MAX_SPLITS = 32


@triton.jit
def attention_decode_split(
    q_ptr, k_ptr, v_ptr, index_ptr, acc_ptr, max_ptr, sum_ptr,
    stride_kh, stride_kt, stride_vh, stride_vt, context, window, scale, H, G, DK, DV,
    GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    WINDOWED: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    token = tl.program_id(2)
    index = tl.load(index_ptr + token)
    g = tl.arange(0, GROUP)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q_mask = (g < G)[:, None] & (dk < DK)[None, :]
    q = tl.load(q_ptr + (token * H + kv_head * G + g)[:, None] * DK + dk[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    # this token's span (decode_span) cut into n_splits ranges of whole loop steps; ranges past the
    # span stay empty. The visible entries of a range: t <= index (and t > index - window); every loop
    # step then holds at least one visible key, so the running maximum is finite after the first
    span = tl.minimum(context, (index // SPAN + 1) * SPAN)
    chunk = tl.cdiv(tl.cdiv(span, n_splits), BLOCK_T) * BLOCK_T
    lo = split * chunk
    hi = tl.minimum(tl.minimum(lo + chunk, span), index + 1)
    if WINDOWED:
        lo = tl.maximum(lo, index - window + 1)
    running_max = tl.full((GROUP,), float("-inf"), tl.float32)
    running_sum = tl.zeros((GROUP,), tl.float32)
    acc = tl.zeros((GROUP, BLOCK_DV), tl.float32)
    for start in range(lo, hi, BLOCK_T):
        t = start + tl.arange(0, BLOCK_T)
        ok = t < hi
        k = tl.load(
            k_ptr + kv_head * stride_kh + t[:, None] * stride_kt + dk[None, :],
            mask=ok[:, None] & (dk < DK)[None, :],
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        scores = tl.where(ok[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp(running_max - new_max)
        p = tl.exp(scores - new_max[:, None])
        v = tl.load(
            v_ptr + kv_head * stride_vh + t[:, None] * stride_vt + dv[None, :],
            mask=ok[:, None] & (dv < DV)[None, :],
            other=0.0,
        ).to(tl.float32)
        acc = acc * rescale[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        running_sum = running_sum * rescale + tl.sum(p, axis=1)
        running_max = new_max
    part = ((token * tl.num_programs(0) + kv_head) * n_splits + split) * GROUP + g
    tl.store(acc_ptr + part[:, None] * BLOCK_DV + dv[None, :], acc)
    tl.store(max_ptr + part, running_max)
    tl.store(sum_ptr + part, running_sum)


@triton.jit
def attention_decode_combine(
    acc_ptr, max_ptr, sum_ptr, out_ptr, n_kv, n_splits, H, G, DV,
    GROUP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    # empty ranges hold maximum -inf, sum 0 and acc 0: their weight is exactly 0
    head = tl.program_id(0)
    token = tl.program_id(1)
    kv_head = head // G
    s = tl.arange(0, SPLITS)
    dv = tl.arange(0, BLOCK_DV)
    part = ((token * n_kv + kv_head) * n_splits + s) * GROUP + head % G
    maxima = tl.load(max_ptr + part, mask=s < n_splits, other=float("-inf"))
    top = tl.max(maxima, axis=0)  # finite: the range holding the query's own entry saw it
    weight = tl.exp(maxima - top)
    total = tl.sum(weight * tl.load(sum_ptr + part, mask=s < n_splits, other=0.0), axis=0)
    acc = tl.load(acc_ptr + part[:, None] * BLOCK_DV + dv[None, :], mask=(s < n_splits)[:, None], other=0.0)
    out = tl.sum(weight[:, None] * acc, axis=0) / total
    tl.store(out_ptr + (token * H + head) * DV + dv, out, mask=dv < DV)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def decode_launch(
    n_heads: int, n_kv: int, key_dim: int, value_dim: int, programs: int
) -> tuple[int, int, int]:
    """(GROUP, BLOCK_T, splits): the query heads per KV head padded to a power of two, keys per loop
    step within the register budget, and ranges per KV head such that about `programs` programs run
    per token. Independent of the position: the kernel cuts each token's span into these ranges."""
    group = triton.next_power_of_2(n_heads // n_kv)
    block_t = max(8, min(64, ELEMENTS_PER_STEP // (group * triton.next_power_of_2(max(key_dim, value_dim)))))
    return group, block_t, max(1, min(MAX_SPLITS, programs // n_kv))


@register("cuda", "attention_decode")
class TritonAttentionDecode:
    name = "triton-attention-decode"
    # every step reads the span a captured graph at its position reads (the kernel bounds it by the
    # position on the device), so eager steps and drafted tokens verified together give the graph's numbers
    span = staticmethod(decode_span)
    tokens_at_once = True  # one launch takes several tokens, each at its own position

    @staticmethod
    def apply(
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        index: torch.Tensor,
        scale: float,
        window: int | None,
        programs: int | None = None,
    ) -> torch.Tensor:
        """Same contract as the torch reference (`gufo.kernels.attention`), for T tokens: q [T, H, Dk]
        at cache positions index ([T] int64, each below keys' length) -> [T, H * Dv] in q's dtype.
        `programs`: how many programs to aim for per token (default two per multiprocessor)."""
        n_tokens, n_heads, key_dim = q.shape
        n_kv, context, _ = keys.shape
        value_dim = values.shape[-1]
        programs = programs or 2 * _multiprocessors(q.device)
        group, block_t, splits = decode_launch(n_heads, n_kv, key_dim, value_dim, programs)
        block_dv = triton.next_power_of_2(value_dim)
        acc = torch.empty(n_tokens, n_kv, splits, group, block_dv, dtype=torch.float32, device=q.device)
        maxima = torch.empty(n_tokens, n_kv, splits, group, dtype=torch.float32, device=q.device)
        sums = torch.empty_like(maxima)
        q = q.contiguous()
        attention_decode_split[(n_kv, splits, n_tokens)](
            q, keys, values, index, acc, maxima, sums,
            keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
            context, window or 0, scale, n_heads, n_heads // n_kv, key_dim, value_dim,
            GROUP=group, BLOCK_T=block_t, BLOCK_DK=triton.next_power_of_2(key_dim), BLOCK_DV=block_dv,
            WINDOWED=window is not None, SPAN=SPAN_STEP, num_warps=NUM_WARPS,
        )  # fmt: skip
        out = torch.empty(n_tokens, n_heads, value_dim, dtype=torch.float32, device=q.device)
        attention_decode_combine[(n_heads, n_tokens)](
            acc, maxima, sums, out, n_kv, splits, n_heads, n_heads // n_kv, value_dim,
            GROUP=group, SPLITS=triton.next_power_of_2(splits), BLOCK_DV=block_dv, num_warps=NUM_WARPS,
        )  # fmt: skip
        return out.to(q.dtype).reshape(n_tokens, -1)


# (query heads, KV heads, head dim, sliding window) of real models: Qwen3-0.6B, gemma3-270m (global and
# sliding-window layers), SmolLM2-135M; cache lengths of a short and a long context; the programs an
# H200 asks for (2 x 132 multiprocessors).
REFERENCE_GEOMETRIES = ((16, 8, 128, None), (4, 1, 256, None), (4, 1, 256, 512), (9, 3, 64, None))
REFERENCE_SPANS = (512, 8192)
REFERENCE_PROGRAMS = 264


def launch_examples():
    """For `gufo kernels own` (gufo.kernels.triton.offline, which intercepts the launches): the GPU
    engine's decode attention on the reference geometries, as meta tensors (float32 queries, the GPU
    KV cache's dtype). Yields the label of the launches that follow."""
    from gufo.kernels.backends import cache_dtype  # imported late: backends imports the kernels

    dtype = cache_dtype("cuda")
    yield f"{str(dtype).removeprefix('torch.')}_cache"
    for n_heads, n_kv, dim, window in REFERENCE_GEOMETRIES:
        for span in REFERENCE_SPANS:
            q = torch.empty(1, n_heads, dim, device="meta")
            cache = torch.empty(n_kv, span, dim, dtype=dtype, device="meta")
            index = torch.empty(1, dtype=torch.int64, device="meta")
            TritonAttentionDecode.apply(q, cache, cache, index, dim**-0.5, window, REFERENCE_PROGRAMS)

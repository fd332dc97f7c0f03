"""One-token attention over the KV cache (decode), split across the context ("flash decoding").

A decode step has one query row per head, so a kernel per KV head alone would leave most of the GPU
idle at long depths. `attention_decode_split` gives each program one KV head and one range of cache
entries: it reads that range's keys and values once for all the query heads sharing the KV head
(GQA), keeps a running maximum and sum (online softmax) in float32, and writes its partial result;
`attention_decode_combine` rescales and adds the partials per head. The cache may be float16 (what
the GPU engine stores) or float32; the arithmetic is float32 either way.

The query position is read from a device tensor and bounds the loops, so the kernels run inside a
captured CUDA graph at any position below the span they were launched with.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gufo.kernels.attention import decode_span
from gufo.kernels.registry import register

ELEMENTS_PER_STEP = 8192  # GROUP x BLOCK_T x head_dim products per loop step (register budget)
NUM_WARPS = 4
# At most this many context ranges per KV head: the combine kernel holds SPLITS x head_dim partials per
# program, and 256 x 256 spilled registers on sm_90 and gfx1151 (`gufo kernels own`).
MAX_SPLITS = 32


@triton.jit
def attention_decode_split(
    q_ptr, k_ptr, v_ptr, index_ptr, acc_ptr, max_ptr, sum_ptr,
    stride_kh, stride_kt, stride_vh, stride_vt, chunk, span, window, scale, G, DK, DV,
    GROUP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
    WINDOWED: tl.constexpr,
):  # fmt: skip
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    index = tl.load(index_ptr)
    g = tl.arange(0, GROUP)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q_mask = (g < G)[:, None] & (dk < DK)[None, :]
    q = tl.load(q_ptr + (kv_head * G + g)[:, None] * DK + dk[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    # the visible entries of this range: t <= index (and t > index - window); every loop step then
    # holds at least one visible key, so the running maximum is finite after the first
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
    part = (kv_head * n_splits + split) * GROUP + g
    tl.store(acc_ptr + part[:, None] * BLOCK_DV + dv[None, :], acc)
    tl.store(max_ptr + part, running_max)
    tl.store(sum_ptr + part, running_sum)


@triton.jit
def attention_decode_combine(
    acc_ptr, max_ptr, sum_ptr, out_ptr, n_splits, G, DV,
    GROUP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(0)
    kv_head = head // G
    s = tl.arange(0, SPLITS)
    dv = tl.arange(0, BLOCK_DV)
    part = (kv_head * n_splits + s) * GROUP + head % G
    maxima = tl.load(max_ptr + part, mask=s < n_splits, other=float("-inf"))
    top = tl.max(maxima, axis=0)  # finite: the range holding the query's own entry saw it
    weight = tl.where(s < n_splits, tl.exp(maxima - top), 0.0)
    total = tl.sum(weight * tl.load(sum_ptr + part, mask=s < n_splits, other=0.0), axis=0)
    acc = tl.load(acc_ptr + part[:, None] * BLOCK_DV + dv[None, :], mask=(s < n_splits)[:, None], other=0.0)
    out = tl.sum(weight[:, None] * acc, axis=0) / total
    tl.store(out_ptr + head * DV + dv, out, mask=dv < DV)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def decode_launch(
    n_heads: int, n_kv: int, span: int, key_dim: int, value_dim: int, programs: int
) -> tuple[int, int, int, int]:
    """(GROUP, BLOCK_T, chunk, splits): the query heads per KV head padded to a power of two, keys
    per loop step within the register budget, and cache entries per program such that about
    `programs` programs run (each range a whole number of loop steps)."""
    group = triton.next_power_of_2(n_heads // n_kv)
    block_t = max(8, min(64, ELEMENTS_PER_STEP // (group * triton.next_power_of_2(max(key_dim, value_dim)))))
    wanted = max(1, min(MAX_SPLITS, programs // n_kv))
    chunk = triton.cdiv(triton.cdiv(span, wanted), block_t) * block_t
    return group, block_t, chunk, triton.cdiv(span, chunk)


@register("cuda", "attention_decode")
class TritonAttentionDecode:
    name = "triton-attention-decode"
    # every step reads the span a captured graph at its position reads, so eager steps and drafted
    # tokens verified together split the cache the same way and give the graph's numbers
    span = staticmethod(decode_span)

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
        """Same contract as the torch reference (`gufo.kernels.attention`): [1, H * Dv] in q's dtype.
        `programs`: how many programs to aim for (default two per multiprocessor)."""
        n_heads, key_dim = q.shape
        n_kv, span, _ = keys.shape
        value_dim = values.shape[-1]
        programs = programs or 2 * _multiprocessors(q.device)
        group, block_t, chunk, splits = decode_launch(n_heads, n_kv, span, key_dim, value_dim, programs)
        block_dv = triton.next_power_of_2(value_dim)
        acc = torch.empty(n_kv, splits, group, block_dv, dtype=torch.float32, device=q.device)
        maxima = torch.empty(n_kv, splits, group, dtype=torch.float32, device=q.device)
        sums = torch.empty_like(maxima)
        q = q.contiguous()
        attention_decode_split[(n_kv, splits)](
            q, keys, values, index, acc, maxima, sums,
            keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
            chunk, span, window or 0, scale, n_heads // n_kv, key_dim, value_dim,
            GROUP=group, BLOCK_T=block_t, BLOCK_DK=triton.next_power_of_2(key_dim), BLOCK_DV=block_dv,
            WINDOWED=window is not None, num_warps=NUM_WARPS,
        )  # fmt: skip
        out = torch.empty(n_heads, value_dim, dtype=torch.float32, device=q.device)
        attention_decode_combine[(n_heads,)](
            acc, maxima, sums, out, splits, n_heads // n_kv, value_dim,
            GROUP=group, SPLITS=triton.next_power_of_2(splits), BLOCK_DV=block_dv, num_warps=NUM_WARPS,
        )  # fmt: skip
        return out.to(q.dtype).reshape(1, -1)


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
            q = torch.empty(n_heads, dim, device="meta")
            cache = torch.empty(n_kv, span, dim, dtype=dtype, device="meta")
            index = torch.empty(1, dtype=torch.int64, device="meta")
            TritonAttentionDecode.apply(q, cache, cache, index, dim**-0.5, window, REFERENCE_PROGRAMS)

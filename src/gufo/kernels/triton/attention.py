"""Decode attention over the KV cache: each query token attends to the cache up to its own position,
split across the context ("flash decoding").

A decode step has one query row per head, so a kernel per KV head alone would leave most of the GPU
idle at long depths. Each token's entries are cut into ranges, and `attention_decode_split` gives each
program one token, one KV head and one range of them (several ranges in turn where many tokens share
the launch: `split_programs`): it reads a range's keys and values once for all the query heads sharing
the KV head (GQA), keeps a running maximum and sum (online softmax) in float32, and writes the range's
partial result; `attention_decode_combine` rescales and adds the partials per head. The cache may be float16
(what the GPU engine stores) or float32; the arithmetic is float32 either way.

Each token's position is read from a device tensor, and so is how the cache entries up to it are cut
into ranges. The launch shape depends on the head layout alone, so one captured CUDA graph serves every
position, and a token gives the same numbers whether it runs alone or among drafted tokens (speculative
verification), whatever length of cache it is given.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gufo.kernels.contracts import ATTENTION_DECODE, AttentionDecodeKernel
from gufo.kernels.int8_rows import ACT_BLOCK, Int8Rows, row_outputs
from gufo.kernels.kv_pages import KVPages
from gufo.kernels.registry import Registration
from gufo.kernels.triton.checks import check_device, check_dims, check_dtype, check_size
from gufo.kernels.triton.dependent_launch import DependentLaunch, LaunchedKernel, wait_for_inputs
from gufo.kernels.triton.jit_helpers import store_int8_row

ELEMENTS_PER_STEP = 8192  # GROUP x BLOCK_T x head_dim products per loop step, elementwise (register budget)
DOT_ELEMENTS = 4096  # BLOCK_T x head_dim per loop step with tl.dot (NVIDIA)
DOT_ROWS = 16  # the smallest M of tl.dot: query heads held per program on that path
NUM_WARPS = 4
NUM_STAGES = 3  # loop steps in flight on the tl.dot path (Triton pipelines the key and value loads)
# Context ranges per KV head at most (one program each).
MAX_SPLITS = 256
PROGRAMS_PER_MULTIPROCESSOR = 2  # programs per token aimed for (ranges x KV heads)
COMBINE_SPLITS = 32  # ranges the combine kernel holds at once (it loops over the rest)
COMBINE_COLUMNS = 32  # value columns per combine program (one int8 block)


@triton.jit
def _range_size(index, n_splits, BLOCK_T: tl.constexpr):
    """Cache entries per range for a token at `index`: its entries 0..index cut into n_splits ranges of
    whole loop steps (the last ranges may stay empty). Cut by the position alone, not by the cache's
    length: a longer cache (a benchmark's prompt room) must not lengthen the ranges."""
    return tl.cdiv(tl.cdiv(index + 1, n_splits), BLOCK_T) * BLOCK_T


@triton.jit
def _product(a, b, DOT: tl.constexpr):
    """a [M, K] @ b [K, N] in float32: tl.dot on tensor cores (NVIDIA) with the float32 operands split
    into three TF32 products (about float32 accuracy; float16 cache entries are exact in TF32), or an
    elementwise product summed over K (AMD, where tl.dot tiles spilled on gfx1151). A float32 tl.dot
    without tensor cores spilled on sm_90."""
    if DOT:
        return tl.dot(a, b, input_precision="tf32x3")
    return tl.sum(a[:, :, None] * b[None, :, :], axis=1)


@triton.jit
def attention_decode_split(
    q_ptr, k_ptr, v_ptr, table_ptr, index_ptr, slot_ptr, acc_ptr, max_ptr, sum_ptr, stride_table,
    stride_kh, stride_kp, stride_kt, stride_vh, stride_vp, stride_vt, window, scale, H, G, DK, DV,
    n_splits, PAGE: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, WINDOWED: tl.constexpr, DOT: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """Per (KV head, program, token): the G query heads of the KV head (ROWS held, GROUP stored) over
    each of the token's n_splits ranges that the program takes (every num_programs(1)-th from its own),
    as one partial softmax per range: running maximum, sum and weighted values. A range's partial is the
    same whichever program computes it, so the grid's width changes no number. The token's entries are
    slot slot_ptr[token]'s, position t at offset t % PAGE of page table[slot, t // PAGE] (table stride
    0: one slot's table row for every token)."""
    wait_for_inputs(PDL)
    kv_head = tl.program_id(0)
    token = tl.program_id(2)
    index = tl.load(index_ptr + token)
    slot = tl.load(slot_ptr + token)
    table_ptr += slot * stride_table
    g = tl.arange(0, ROWS)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q_mask = (g < G)[:, None] & (dk < DK)[None, :]
    q = tl.load(q_ptr + (token * H + kv_head * G + g)[:, None] * DK + dk[None, :], mask=q_mask, other=0.0)
    q = q.to(tl.float32) * scale
    # the visible entries of a range: t <= index (and t > index - window); every loop step of a
    # non-empty range then holds at least one visible key, so the running maximum is finite after the
    # first. Empty ranges store nothing: the combine kernel skips them by the same arithmetic; ranges
    # past the one holding the token's own entry are empty, so the programs stop there.
    chunk = _range_size(index, n_splits, BLOCK_T)
    for split in range(tl.program_id(1), index // chunk + 1, tl.num_programs(1)):
        lo = split * chunk
        hi = tl.minimum(lo + chunk, index + 1)
        if WINDOWED:
            lo = tl.maximum(lo, index - window + 1)
        running_max = tl.full((ROWS,), float("-inf"), tl.float32)
        running_sum = tl.zeros((ROWS,), tl.float32)
        acc = tl.zeros((ROWS, BLOCK_DV), tl.float32)
        for start in range(lo, hi, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)
            ok = t < hi
            page = tl.load(table_ptr + t // PAGE, mask=ok, other=0)
            key_at = page * stride_kp + (t % PAGE) * stride_kt
            value_at = page * stride_vp + (t % PAGE) * stride_vt
            # both loads issued before the arithmetic that waits for them
            k = tl.load(
                k_ptr + kv_head * stride_kh + key_at[None, :] + dk[:, None],
                mask=ok[None, :] & (dk < DK)[:, None],
                other=0.0,
            ).to(tl.float32)  # [BLOCK_DK, BLOCK_T]
            v = tl.load(
                v_ptr + kv_head * stride_vh + value_at[:, None] + dv[None, :],
                mask=ok[:, None] & (dv < DV)[None, :],
                other=0.0,
            ).to(tl.float32)
            scores = tl.where(ok[None, :], _product(q, k, DOT), float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp(running_max - new_max)
            p = tl.exp(scores - new_max[:, None])
            acc = acc * rescale[:, None] + _product(p, v, DOT)
            running_sum = running_sum * rescale + tl.sum(p, axis=1)
            running_max = new_max
        part = ((token * tl.num_programs(0) + kv_head) * n_splits + split) * GROUP + g
        filled = (lo < hi) & (g < GROUP)
        tl.store(acc_ptr + part[:, None] * BLOCK_DV + dv[None, :], acc, mask=filled[:, None])
        tl.store(max_ptr + part, running_max, mask=filled)
        tl.store(sum_ptr + part, running_sum, mask=filled)


@triton.jit
def attention_decode_combine(
    acc_ptr, max_ptr, sum_ptr, index_ptr, out_ptr, xq_ptr, xd_ptr, xs_ptr, n_kv, n_splits, window,
    H, G, DV, GROUP: tl.constexpr, SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr, COLUMNS: tl.constexpr,
    BLOCK_T: tl.constexpr, WINDOWED: tl.constexpr, INT8: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Per (head, token, COLUMNS value columns): the ranges the split kernel filled, SPLITS at a time,
    weighted by exp(range maximum - overall maximum) (two passes: the maxima, then the sums). INT8: the
    columns (one 32-column block) are stored as `Int8Rows` for the output projection."""
    wait_for_inputs(PDL)
    head = tl.program_id(0)
    token = tl.program_id(1)
    column = tl.program_id(2) * COLUMNS
    kv_head = head // G
    index = tl.load(index_ptr + token)
    chunk = _range_size(index, n_splits, BLOCK_T)
    first = 0
    if WINDOWED:
        first = tl.maximum(index - window + 1, 0) // chunk
    last = index // chunk + 1  # the range holding the query's own entry, which it always sees
    base = (token * n_kv + kv_head) * n_splits
    maxima = tl.full((SPLITS,), float("-inf"), tl.float32)
    for s0 in range(first, last, SPLITS):
        s = s0 + tl.arange(0, SPLITS)
        got = tl.load(max_ptr + (base + s) * GROUP + head % G, mask=s < last, other=float("-inf"))
        maxima = tl.maximum(maxima, got)
    top = tl.max(maxima, axis=0)
    dv = column + tl.arange(0, COLUMNS)
    sums = tl.zeros((SPLITS,), tl.float32)
    out = tl.zeros((COLUMNS,), tl.float32)
    for s0 in range(first, last, SPLITS):
        s = s0 + tl.arange(0, SPLITS)
        part = (base + s) * GROUP + head % G
        weight = tl.exp(tl.load(max_ptr + part, mask=s < last, other=float("-inf")) - top)
        sums += weight * tl.load(sum_ptr + part, mask=s < last, other=0.0)
        acc = tl.load(acc_ptr + part[:, None] * BLOCK_DV + dv[None, :], mask=(s < last)[:, None], other=0.0)
        out += tl.sum(weight[:, None] * acc, axis=0)
    out = out / tl.sum(sums, axis=0)
    if INT8:
        store_int8_row(out, token, head * DV + column, H * DV, xq_ptr, xd_ptr, xs_ptr, COLUMNS)
    else:
        tl.store(out_ptr + (token * H + head) * DV + dv, out, mask=dv < DV)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def use_dot() -> bool:
    """tl.dot for the two products on NVIDIA, where Triton pipelines the loads that feed it
    (docs/decisions.md, "Decode attention: tl.dot, 2 programs per multiprocessor, 3 stages"); AMD keeps
    the elementwise form."""
    return torch.version.hip is None


DOT_MAX_WIDTH = 128  # wider heads (gemma3's 256) spilled on the tl.dot path for sm_90, even on 8 warps


def _check_decode_operands(
    q: torch.Tensor, pages: KVPages, index: torch.Tensor, slots: torch.Tensor | int
) -> None:
    """The shapes, dtypes and devices `TritonAttentionDecode.apply` takes; raises naming a mismatch."""
    check_dims("q", q, 3)
    keys, values = pages.keys, pages.values
    for what, tensor in (("keys", keys), ("values", values), ("table", pages.table)):
        check_dims(what, tensor, 2 if what == "table" else 4)
        check_device(what, tensor, q.device)
    if isinstance(slots, torch.Tensor):
        check_device("slots", slots, q.device)
        check_dtype("slots", slots, (torch.int64,))
        check_size("slots entries (one per token)", slots.numel(), q.shape[0])
    check_device("index", index, q.device)
    check_dtype("q", q, (torch.float32, torch.float16, torch.bfloat16))
    # the GPU cache's type (backends.cache_dtype), the one the kernels are compiled and tested for
    check_dtype("keys", keys, (torch.float16,))
    check_dtype("values", values, (torch.float16,))
    check_dtype("index", index, (torch.int64,))
    check_dtype("table", pages.table, (torch.int64,))
    check_size("index entries (one per token)", index.numel(), q.shape[0])
    check_size("values' KV heads", values.shape[0], keys.shape[0])
    check_size("values' pages", values.shape[1], keys.shape[1])
    check_size("values' page size", values.shape[2], keys.shape[2])
    check_size("keys' head width", keys.shape[3], q.shape[2])
    if q.shape[1] % keys.shape[0]:
        raise ValueError(f"{q.shape[1]} query heads do not share {keys.shape[0]} KV heads evenly")


def decode_launch(
    n_heads: int, n_kv: int, key_dim: int, value_dim: int, programs: int, dot: bool
) -> tuple[int, int, int, int]:
    """(GROUP, ROWS, BLOCK_T, splits): the query heads per KV head padded to a power of two, the rows
    of queries a program holds (at least DOT_ROWS for tl.dot), keys per loop step within the register
    budget, and ranges per KV head such that about `programs` programs run per token. Independent of
    the position: the kernels cut each token's span into these ranges."""
    group = triton.next_power_of_2(n_heads // n_kv)
    width = triton.next_power_of_2(max(key_dim, value_dim))
    splits = max(1, min(MAX_SPLITS, programs // n_kv))
    if dot:
        return group, max(DOT_ROWS, group), max(16, min(64, DOT_ELEMENTS // width)), splits
    return group, group, max(8, min(64, ELEMENTS_PER_STEP // (group * width))), splits


def split_programs(splits: int, n_kv: int, n_tokens: int, programs: int) -> int:
    """Programs per (KV head, token) of the split kernel: one per range for a token alone, fewer as tokens
    share the launch (a decode step of many sequences: about `programs` in all, where one program per
    range would launch that many per token, mostly over empty ranges at short depths), each taking every
    so many of its token's ranges. A range's partial is computed alike whatever program takes it, so
    this spreads the work without changing a number; the ranges themselves (`splits`) depend on the
    device alone."""
    return max(1, min(splits, programs // (n_kv * n_tokens)))


class TritonAttentionDecode(LaunchedKernel, AttentionDecodeKernel):
    name = "triton-attention-decode"

    def apply(
        self,
        q: torch.Tensor,
        pages: KVPages,
        index: torch.Tensor,
        slots: torch.Tensor | int,
        scale: float,
        window: int | None,
        int8: bool = False,
        programs: int | None = None,
    ) -> torch.Tensor | Int8Rows:
        """Same contract as the torch reference (`gufo.kernels.attention`), for T tokens in one launch:
        q [T, H, Dk] at cache positions index ([T] int64) of slot slots[t] (or the one slot given) ->
        [T, H * Dv] in q's dtype (`int8`: float32 rows as `Int8Rows`). The kernels read and split each
        token's entries up to its position on the device, so eager steps and drafted tokens verified
        together give the graph's numbers. `programs`: how many programs to aim for per token (default
        PROGRAMS_PER_MULTIPROCESSOR per multiprocessor)."""
        _check_decode_operands(q, pages, index, slots)
        keys, values = pages.keys, pages.values
        table, slot_of, table_stride = pages.launch_rows(index, slots)
        n_tokens, n_heads, key_dim = q.shape
        n_kv = keys.shape[0]
        value_dim = values.shape[-1]
        programs = programs or PROGRAMS_PER_MULTIPROCESSOR * _multiprocessors(q.device)
        dot = use_dot() and max(key_dim, value_dim) <= DOT_MAX_WIDTH
        group, rows, block_t, splits = decode_launch(n_heads, n_kv, key_dim, value_dim, programs, dot)
        block_dv = triton.next_power_of_2(value_dim)
        acc = torch.empty(n_tokens, n_kv, splits, group, block_dv, dtype=torch.float32, device=q.device)
        maxima = torch.empty(n_tokens, n_kv, splits, group, dtype=torch.float32, device=q.device)
        sums = torch.empty_like(maxima)
        q = q.contiguous()
        launch = self.launch.options(q.device)
        attention_decode_split[(n_kv, split_programs(splits, n_kv, n_tokens, programs), n_tokens)](
            q, keys, values, table, index, slot_of, acc, maxima, sums, table_stride, keys.stride(0),
            keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
            window or 0, scale, n_heads, n_heads // n_kv, key_dim, value_dim, splits, PAGE=pages.page_size,
            GROUP=group, ROWS=rows, BLOCK_T=block_t, BLOCK_DK=triton.next_power_of_2(key_dim),
            BLOCK_DV=block_dv, WINDOWED=window is not None, DOT=dot, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES, **launch,
        )  # fmt: skip
        if int8 and value_dim % ACT_BLOCK:  # each combine program quantizes whole blocks of one head
            raise ValueError(f"int8 rows need a head width that is a multiple of {ACT_BLOCK}")
        out, pointers = row_outputs(n_tokens, n_heads * value_dim, q.device, int8)
        # no fused multiply-adds: the quantizing variant must round as the plain one (store_int8_blocks)
        held = min(COMBINE_SPLITS, triton.next_power_of_2(splits))
        columns = min(COMBINE_COLUMNS, block_dv)
        attention_decode_combine[(n_heads, n_tokens, triton.cdiv(value_dim, columns))](
            acc, maxima, sums, index, *pointers, n_kv, splits, window or 0, n_heads,
            n_heads // n_kv, value_dim, GROUP=group, SPLITS=held, BLOCK_DV=block_dv, COLUMNS=columns,
            BLOCK_T=block_t, WINDOWED=window is not None, INT8=int8, num_warps=1,
            enable_fp_fusion=False, **launch,
        )  # fmt: skip
        return out if int8 else out.to(q.dtype)


def registrations(launch: DependentLaunch) -> tuple[Registration, ...]:
    return (Registration("cuda", ATTENTION_DECODE, TritonAttentionDecode(launch)),)

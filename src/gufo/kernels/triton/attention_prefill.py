"""Prefill attention on fixed tiles ("attention_prefill" on "cuda" with `--prefill-products tiles`):
each query row's numbers depend on its query, its position and its slot's entries up to that position
alone, never on the chunk of the prompt it came in or on the rows sharing its launch (chunk invariance
by construction, as the prefill products' fixed tiles give row invariance).

Every program takes BLOCK_M query rows of one head and runs over the keys in blocks of BLOCK_N entries
cut at absolute positions (multiples of BLOCK_N), in order, keeping flash attention's running maximum,
sum and weighted values in float32, both products on float16 tensor-core operands. A row meets the
same blocks in the same order whatever its tile: a block of which a row sees no entry leaves the row's
running values as they were, bit for bit (rescaled by exactly 1, added exact zeros), so the blocks a
tile runs past a row's own position, or before the row's window, change none of its numbers; and a
tensor-core product gives each row its own dot products. torch's SDPA promises nothing of the kind: it
picks its kernel by the shapes, and its flash kernel walks a query tile's key blocks from the tile's
last one down and may split the keys by the launch's shape, so a row's order of additions can move with
the chunk it came in (docs/decisions.md, "Chunk-invariant GPU prefill").
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gufo.kernels.attention import FusedAttentionPrefill
from gufo.kernels.contracts import ATTENTION_PREFILL, AttentionPrefillKernel
from gufo.kernels.registry import Registration
from gufo.kernels.triton import shared_memory
from gufo.kernels.triton.checks import check_device, check_dims, check_dtype, check_size
from gufo.options import KernelOptions


@triton.jit(do_not_specialize=["n_tokens", "first", "end", "window"])
def attention_prefill_tiles(
    q_ptr, k_ptr, v_ptr, out_ptr, n_tokens, first, end, window, qk_scale, stride_qt, stride_qh,
    stride_kh, stride_kt, stride_vh, stride_vt, H, G, DK, DV, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr, WINDOWED: tl.constexpr,
):  # fmt: skip
    """Per (head, tile of BLOCK_M rows): the rows are the queries at positions end - n_tokens.., the
    keys and values those of positions first..end - 1 (entry t at offset t - first); qk_scale is the
    softmax scale times log2(e) (the exponentials are powers of two)."""
    head = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = head // G
    row = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    real = row < n_tokens
    position = end - n_tokens + row  # rows past n_tokens: past the entries, computed and never stored
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        q_ptr + row[:, None] * stride_qt + head * stride_qh + dk[None, :],
        mask=real[:, None] & (dk < DK)[None, :],
        other=0.0,
    ).to(tl.float16)
    running_max = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    running_sum = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    # the blocks any of the tile's rows sees something of, from a multiple of BLOCK_N
    lo = first
    if WINDOWED:
        lo = tl.maximum(first, end - n_tokens + tile * BLOCK_M - window + 1)
    hi = tl.minimum(end, end - n_tokens + (tile + 1) * BLOCK_M)
    for start in range(lo // BLOCK_N * BLOCK_N, hi, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        held = (t >= first) & (t < end)
        k = tl.load(
            k_ptr + kv_head * stride_kh + (t - first)[None, :] * stride_kt + dk[:, None],
            mask=held[None, :] & (dk < DK)[:, None],
            other=0.0,
        )  # [BLOCK_DK, BLOCK_N]
        v = tl.load(
            v_ptr + kv_head * stride_vh + (t - first)[:, None] * stride_vt + dv[None, :],
            mask=held[:, None] & (dv < DV)[None, :],
            other=0.0,
        )
        seen = held[None, :] & (t[None, :] <= position[:, None])
        if WINDOWED:
            seen &= t[None, :] > position[:, None] - window
        scores = tl.where(seen, tl.dot(q, k) * qk_scale, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # a block a row sees nothing of: rescale by exactly 1, add exact zeros (no -inf - -inf either)
        rescale = tl.where(new_max == running_max, 1.0, tl.exp2(running_max - new_max))
        p = tl.exp2(scores - tl.where(new_max == float("-inf"), 0.0, new_max)[:, None])
        running_sum = running_sum * rescale + tl.sum(p, axis=1)
        acc = acc * rescale[:, None] + tl.dot(p.to(tl.float16), v)
        running_max = new_max
    out = acc / running_sum[:, None]
    tl.store(
        out_ptr + row[:, None] * (H * DV) + head * DV + dv[None, :],
        out,
        mask=real[:, None] & (dv < DV)[None, :],
    )


# (BLOCK_M, BLOCK_N, num_warps, num_stages) by head width (keys and values alike) up to: BLOCK_N cuts the
# keys, so it is part of the numbers (a function of the model alone); chosen to compile without spills
TILES = ((64, (64, 64, 4, 3)), (128, (128, 64, 8, 3)), (256, (64, 32, 8, 2)))
MAX_WIDTH = TILES[-1][0]


def tiles_for(width: int) -> tuple[int, int, int, int]:
    """The launch of heads `width` wide (the wider of the key and value heads)."""
    for most, tiles in TILES:
        if width <= most:
            return tiles
    raise ValueError(f"prefill attention tiles take heads up to {MAX_WIDTH} wide, got {width}")


def _check_operands(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """The shapes, dtypes and devices `TritonAttentionPrefill.apply` takes; raises naming a mismatch."""
    check_dims("q", q, 3)
    check_dims("keys", keys, 3)
    check_dims("values", values, 3)
    for what, tensor in (("keys", keys), ("values", values)):
        check_device(what, tensor, q.device)
        # the GPU cache's type (backends.cache_dtype), the one the kernel is compiled and tested for
        check_dtype(what, tensor, (torch.float16,))
    check_dtype("q", q, (torch.float32, torch.float16, torch.bfloat16))
    check_size("values' KV heads", values.shape[0], keys.shape[0])
    check_size("values' entries", values.shape[1], keys.shape[1])
    check_size("keys' head width", keys.shape[2], q.shape[2])
    if q.shape[1] % keys.shape[0]:
        raise ValueError(f"{q.shape[1]} query heads do not share {keys.shape[0]} KV heads evenly")
    if q.shape[0] > keys.shape[1]:
        raise ValueError(
            f"{q.shape[0]} queries over {keys.shape[1]} entries: the queries' own are among them"
        )
    for what, tensor in (("q", q), ("keys", keys), ("values", values)):
        if tensor.stride(-1) != 1:
            raise ValueError(f"{what}: the head's elements must be adjacent (unit stride)")


class TritonAttentionPrefill(AttentionPrefillKernel):
    name = "triton-attention-prefill-tiles"
    chunk_invariant = True

    @staticmethod
    def apply(
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        first: int,
        scale: float,
        window: int | None,
        tiles: tuple[int, int, int, int] | None = None,
    ) -> torch.Tensor:
        """The reference's contract (`gufo.kernels.attention`): q [T, H, Dk], the last T of the cache
        entries first..first + S, keys/values [Hkv, S, D] (float16, the GPU cache's), causal (and
        windowed) GQA attention: [T, H * Dv] in q's dtype. `tiles`: (BLOCK_M, BLOCK_N, num_warps,
        num_stages), by default `tiles_for` the head width (tests take small ones)."""
        _check_operands(q, keys, values)
        n_tokens, n_heads, key_dim = q.shape
        n_kv, span, value_dim = values.shape
        out = torch.empty(n_tokens, n_heads * value_dim, dtype=q.dtype, device=q.device)
        block_m, block_n, warps, stages = tiles or tiles_for(max(key_dim, value_dim))
        block_dk, block_dv = triton.next_power_of_2(key_dim), triton.next_power_of_2(value_dim)
        if n_tokens:
            grid = (n_heads, triton.cdiv(n_tokens, block_m))
            shared_memory.launch(
                attention_prefill_tiles, grid, q, keys, values, out, n_tokens, first, first + span,
                window or 0, scale * math.log2(math.e), q.stride(0), q.stride(1), keys.stride(0),
                keys.stride(1), values.stride(0), values.stride(1), n_heads, n_heads // n_kv, key_dim,
                value_dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_DK=block_dk, BLOCK_DV=block_dv,
                WINDOWED=window is not None, num_warps=warps, num_stages=stages,
            )  # fmt: skip
        return out


def registrations(options: KernelOptions) -> tuple[Registration, ...]:
    """The tiles with the tile products (`--prefill-products tiles`, NVIDIA only, as they are), else
    torch's flash kernel (registered again: the options may have changed since the last call)."""
    tiles = options.prefill_products == "tiles" and torch.version.hip is None
    return (
        Registration(
            "cuda", ATTENTION_PREFILL, TritonAttentionPrefill() if tiles else FusedAttentionPrefill()
        ),
    )

"""The launches `gufo kernels own` compiles (gufo.kernels.triton.offline intercepts them): each kernel
module's real launch code run on meta tensors (no memory, no GPU) for the shapes of reference models.

Each `*_examples(options)` yields a label, then makes the launches filed under it, until the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from gguf import GGMLQuantizationType

from gufo.formats import block_shape
from gufo.kernels.backends import cache_dtype
from gufo.kernels.contracts import DeltaGates
from gufo.kernels.expert_groups import group_assignments, tile_rows
from gufo.kernels.int8_rows import ACT_BLOCK
from gufo.kernels.kv_pages import PAGE_TOKENS, KVPages
from gufo.kernels.triton import prefill_tiles
from gufo.kernels.triton.attention import PROGRAMS_PER_MULTIPROCESSOR, TritonAttentionDecode
from gufo.kernels.triton.attention_prefill import TritonAttentionPrefill
from gufo.kernels.triton.decode_candidates import SWEEP_FORMATS, SWEEP_SHAPES, candidates
from gufo.kernels.triton.dependent_launch import DependentLaunch
from gufo.kernels.triton.elementwise import (
    TritonAddRmsNorm,
    TritonAttentionHeads,
    TritonGatedAct,
    TritonGatedRmsNorm,
    TritonRmsNorm,
    TritonRmsNormRope,
    TritonRope,
)
from gufo.kernels.triton.experts import ExpertWeight, TritonExpertLinear
from gufo.kernels.triton.experts_prefill import KERNELS as GROUPED_KERNELS
from gufo.kernels.triton.gemv import TritonLinear
from gufo.kernels.triton.gemv_kernels import FORMATS
from gufo.kernels.triton.launch import (
    MAX_ASSIGNMENTS,
    MAX_BLOCK_M,
    MAX_HALF_ROWS,
    MAX_TENSOR_ROWS,
    TENSOR_ROW_FORMATS,
    gemv,
)
from gufo.kernels.triton.planes import TritonWeight, weight_planes
from gufo.kernels.triton.prefill_gemm import PREFILL_DTYPE
from gufo.kernels.triton.recurrent import TritonCausalConv1d, TritonGatedDeltaRule
from gufo.kernels.triton.routing import TritonMoeCombine, TritonMoeRoute
from gufo.options import KernelOptions

# Weight shapes [N, K] of a real model (Qwen3-0.6B: MLP down, gate/up, attention output, query). Every
# format divides their widths, which give each vector-kernel STEP with one K step and with several.
REFERENCE_SHAPES = ((1024, 3072), (3072, 1024), (1024, 2048), (2048, 1024))
# and a weight past dependent_launch.PREFETCH_MAX_BYTES in every format (its products do not prefetch)
LARGE_SHAPE = (8192, 4096)
# and weights under the default int8 limit (KernelOptions.int8_min_weights: gemma3-270m's attention
# output and FFN down), whose products multiply float32 activations in the formats with int8 kernels too
SMALL_SHAPES = ((640, 1024), (640, 2048))


def meta_weight(qtype: GGMLQuantizationType, n: int, k: int) -> TritonWeight:
    elements, nbytes = block_shape(qtype)
    raw = torch.empty(n, k // elements * nbytes, dtype=torch.uint8, device="meta")
    return TritonWeight(qtype, (n, k), weight_planes(qtype, raw))


def linear_examples(options: KernelOptions) -> Iterator[str]:
    """The engine's products on the reference and small shapes: float32 activations of 1..MAX_BLOCK_M
    rows (decode, speculative, batched) and one more (prefill), plus the tensor-core kernels at the half
    precision they exist for, on int8 rows (NVIDIA: KernelOptions.row_products = "tensor", whatever
    `options` says: one row and MAX_TENSOR_ROWS, the narrow and the wide tiles); one row on the large
    shape. Each format's label is its name. (The float16 rows of "f16" are cuBLAS's: nothing to compile.)"""
    linear = TritonLinear(options)
    for qtype in FORMATS:
        yield qtype.name.lower()
        for n, k in REFERENCE_SHAPES + SMALL_SHAPES:
            weight = meta_weight(qtype, n, k)
            for m in range(1, MAX_BLOCK_M + 2):
                linear.apply(torch.empty(m, k, device="meta"), weight)
            if torch.version.hip is None:  # gemv takes the tensor-core path on NVIDIA only
                x = torch.empty(MAX_BLOCK_M, k, dtype=PREFILL_DTYPE, device="meta")
                gemv(x, weight, linear.int8_min_weights, linear.launch)
                for rows in (1, MAX_TENSOR_ROWS) if qtype in TENSOR_ROW_FORMATS else ():  # narrow, wide tiles
                    gemv(torch.empty(rows, k, device="meta"), weight, 0, linear.launch, tensor_rows=True)
        n, k = LARGE_SHAPE
        linear.apply(torch.empty(1, k, device="meta"), meta_weight(qtype, n, k))


def prefill_tile_examples(options: KernelOptions) -> Iterator[str]:
    """The prefill products on fixed tiles (KernelOptions.prefill_products = "tiles", NVIDIA only, compiled
    whatever the options): float16 and bfloat16 operands on the reference shapes, over the whole of K and
    in a split of it (its partial sums)."""
    if torch.version.hip is not None:
        return
    yield "prefill_tiles"
    for n, k in REFERENCE_SHAPES:
        for dtype in prefill_tiles.OPERAND_DTYPES:
            x = torch.empty(MAX_HALF_ROWS + 1, k, dtype=dtype, device="meta")
            for splits in (1, 4):
                tiles = (*prefill_tiles.TILES[:-1], splits)
                prefill_tiles.product(x, torch.empty(n, k, dtype=dtype, device="meta"), tiles)


def decode_candidate_examples(options: KernelOptions) -> Iterator[str]:
    """The launches the bandwidth sweep times (decode_candidates: one row on each of its shapes, int8
    activations, so NVIDIA only), labelled sweep_<format>: a candidate that spills is dropped there."""
    if torch.version.hip is not None:
        return
    launch = DependentLaunch(options.dependent_launch)
    for qtype in SWEEP_FORMATS:
        yield f"sweep_{qtype.name.lower()}"
        for n, k in SWEEP_SHAPES:
            weight = meta_weight(qtype, n, k)
            for config in candidates(qtype, n, k):
                gemv(torch.empty(1, k, device="meta"), weight, 0, launch, config=config)


# Expert matrices [rows, cols] of Qwen3.5-35B-A3B (hidden 2048, expert FFN 512: gufo.tools.synth's
# "35b-a3b"): gate and up stacked, gate or up alone (when their formats differ), down; 256 experts, and
# the assignments of one token (top-8) and of the most a decode product takes.
DECODE_EXPERTS = ((1024, 2048), (512, 2048), (2048, 512))
REFERENCE_N_EXPERTS = 256
REFERENCE_ASSIGNMENTS = (8, MAX_ASSIGNMENTS)


def expert_decode_examples(options: KernelOptions) -> Iterator[str]:
    """The decode step's expert-indexed products (TritonExpertLinear.gathered) in every format, on the
    reference experts: one token's row for all its assignments and one row each, float32 activations
    (int8 where one expert's matrix takes them: `options`)."""
    kernel = TritonExpertLinear(options)
    yield "experts"
    for qtype in FORMATS:
        for rows, cols in DECODE_EXPERTS:
            weight = ExpertWeight(
                meta_weight(qtype, REFERENCE_N_EXPERTS * rows, cols), REFERENCE_N_EXPERTS, rows
            )
            for assignments in REFERENCE_ASSIGNMENTS:
                ids = torch.empty(assignments, dtype=torch.int64, device="meta")
                for x_rows in (1, assignments):
                    kernel.gathered(torch.empty(x_rows, cols, device="meta"), weight, ids)


# Qwen3.5-35B-A3B's experts (256 of them, 8 per token): gate and up [2 x 512, 2048], down [2048, 512];
# prefills of 512, 1024 and 2048 tokens, which take every tile height (expert_groups.TILE_ROWS)
REFERENCE_EXPERTS = (256, 8, ((1024, 2048), (2048, 512)))
REFERENCE_PREFILLS = (512, 1024, 2048)


def expert_prefill_examples(options: KernelOptions) -> Iterator[str]:
    """The grouped expert products of a prefill (NVIDIA only: ROCm runs one product per expert), on the
    formats with a grouped kernel; each label the format's name with an `experts_` prefix."""
    if torch.version.hip is not None:
        return
    experts = TritonExpertLinear(options)
    n_experts, n_used, shapes = REFERENCE_EXPERTS
    for qtype in GROUPED_KERNELS:
        yield f"experts_{qtype.name.lower()}"
        for tokens in REFERENCE_PREFILLS:
            chosen = torch.empty(tokens, n_used, dtype=torch.int64, device="meta")
            groups = group_assignments(chosen, n_experts, tile_rows(chosen.numel(), n_experts))
            for rows, cols in shapes:
                weight = ExpertWeight(meta_weight(qtype, n_experts * rows, cols), n_experts, rows)
                experts.grouped(torch.empty(chosen.numel(), cols, device="meta"), weight, groups)


# (query heads, KV heads, head dim, sliding window) of real models: Qwen3-0.6B and 8B, gemma3-270m (global and
# sliding-window layers), SmolLM2-135M; cache lengths of a short and a long context; the programs an
# H200 asks for (PROGRAMS_PER_MULTIPROCESSOR x 132 multiprocessors).
REFERENCE_GEOMETRIES = (
    (16, 8, 128, None),
    (32, 8, 128, None),  # Qwen3-8B, the benchmark model
    (4, 1, 256, None),
    (4, 1, 256, 512),
    (9, 3, 64, None),
)
REFERENCE_SPANS = (512, 8192)
REFERENCE_PROGRAMS = PROGRAMS_PER_MULTIPROCESSOR * 132


def attention_examples(options: KernelOptions) -> Iterator[str]:
    """The GPU engine's decode attention on the reference geometries, as meta tensors (float32
    queries, the GPU KV cache's dtype; on NVIDIA also quantizing for the int8 output projection)."""
    kernel = TritonAttentionDecode(DependentLaunch(options.dependent_launch))
    dtype = cache_dtype("cuda")
    yield f"{str(dtype).removeprefix('torch.')}_cache"
    for n_heads, n_kv, dim, window in REFERENCE_GEOMETRIES:
        for span in REFERENCE_SPANS:
            q = torch.empty(1, n_heads, dim, device="meta")
            pages = meta_pages(n_kv, span, dim, dim)
            index = torch.empty(1, dtype=torch.int64, device="meta")
            for int8 in (False, True) if torch.version.hip is None else (False,):
                args = (q, pages, index, 0, dim**-0.5, window, int8)
                kernel.apply(*args, programs=REFERENCE_PROGRAMS)


def prefill_attention_examples(options: KernelOptions) -> Iterator[str]:
    """The prefill attention on fixed tiles (with KernelOptions.prefill_products = "tiles", NVIDIA only,
    compiled whatever the options) on the reference geometries: float32 queries over the GPU cache's
    keys and values."""
    if torch.version.hip is not None:
        return
    yield f"{str(cache_dtype('cuda')).removeprefix('torch.')}_cache"
    for n_heads, n_kv, dim, window in REFERENCE_GEOMETRIES:
        q = torch.empty(64, n_heads, dim, device="meta")
        entries = torch.empty(n_kv, REFERENCE_SPANS[0], dim, dtype=cache_dtype("cuda"), device="meta")
        TritonAttentionPrefill.apply(q, entries, entries, 0, dim**-0.5, window)


def meta_pages(n_kv: int, span: int, key_dim: int, value_dim: int) -> KVPages:
    """A GPU KV cache's pages of one slot holding `span` positions, as meta tensors."""
    n_pages, dtype = span // PAGE_TOKENS, cache_dtype("cuda")
    keys = torch.empty(n_kv, n_pages + 1, PAGE_TOKENS, key_dim, dtype=dtype, device="meta")
    values = torch.empty(n_kv, n_pages + 1, PAGE_TOKENS, value_dim, dtype=dtype, device="meta")
    return KVPages(keys, values, torch.empty(1, n_pages, dtype=torch.int64, device="meta"))


# Widths of real models: Qwen3-0.6B (hidden 1024, FFN 3072, heads 16 x 128 on 8 KV heads, NeoX RoPE),
# SmolLM2-135M (hidden 576, heads 64 wide, adjacent-pair RoPE) and gemma3-270m (hidden 640, GeGLU).
REFERENCE_NORM_WIDTHS = (1024, 576, 640, 128, 64, 256)
REFERENCE_ROPE = ((16, 128, True), (9, 64, False), (4, 256, True))
REFERENCE_FFN = ((3072, "silu"), (2048, "gelu_tanh"))


def elementwise_examples(options: KernelOptions) -> Iterator[str]:
    """The norms, rotary embeddings and gated activations of the reference models, as meta tensors; on
    NVIDIA also the norms and activations that quantize for the int8 products (widths that are
    multiples of 32)."""
    launch = DependentLaunch(options.dependent_launch)
    norm, add_norm, rope = TritonRmsNorm(launch), TritonAddRmsNorm(launch), TritonRope(launch)
    norm_rope, heads_kernel, gated = (
        TritonRmsNormRope(launch),
        TritonAttentionHeads(launch),
        TritonGatedAct(launch),
    )
    yield "float32"
    quantizing = (False, True) if torch.version.hip is None else (False,)
    for width in REFERENCE_NORM_WIDTHS:
        row, weight = torch.empty(1, width, device="meta"), torch.empty(width, device="meta")
        for int8 in quantizing if width % ACT_BLOCK == 0 else (False,):
            norm.apply(row, weight, 1e-6, int8)
            add_norm.apply(row, row, weight, 1e-6, int8)
    for heads, dim, neox in REFERENCE_ROPE:
        tables = torch.empty(1, dim, device="meta")
        rope.apply(torch.empty(1, heads, dim, device="meta"), tables, tables, neox)
        heads_in = torch.empty(1, heads, dim, device="meta")
        norm_rope.apply(heads_in, torch.empty(dim, device="meta"), 1e-6, tables, tables, neox)
        kv_in = torch.empty(1, max(1, heads // 2), dim, device="meta")
        pages = meta_pages(kv_in.shape[1], 64, dim, dim)
        index = torch.empty(1, dtype=torch.int64, device="meta")
        for norm in (torch.empty(dim, device="meta"), None):
            heads_kernel.apply(
                heads_in, kv_in, kv_in, norm, norm, 1e-6, tables, tables, neox, pages, index, 0
            )
    for width, act in REFERENCE_FFN:
        for int8 in quantizing:
            gate, up = torch.empty(1, width, device="meta"), torch.empty(1, width, device="meta")
            gated.apply(gate, up, act, int8)


# Qwen3.5's Gated DeltaNet (0.8B; the 27B's launches take the same constants): the conv over q, k and v
# (6144 channels, kernel 4), 16 value heads of 128 x 128 state
REFERENCE_DELTANET = (6144, 4, 16, 128, 128)


def recurrent_examples(options: KernelOptions) -> Iterator[str]:
    """The recurrent layers' decode steps, as meta tensors, as the mixer launches them (the delta rule
    forming its gates; then the output gate): one sequence's (its slot's state; restarting, a captured
    step, and not, an eager one) and a step of several sequences (rows over a layer's state of every
    slot)."""
    launch = DependentLaunch(options.dependent_launch)
    conv, delta = TritonCausalConv1d(launch), TritonGatedDeltaRule(launch)
    output_gate = TritonGatedRmsNorm(launch)
    channels, width, heads, key_dim, value_dim = REFERENCE_DELTANET
    restart = torch.empty(1, dtype=torch.int64, device="meta")
    parameters = DeltaGates(torch.empty(heads, device="meta"), torch.empty(heads, device="meta"))
    yield "float32"
    for rows, starts in (
        (None, restart),
        (None, None),
        (torch.empty(2, dtype=torch.int64, device="meta"), None),
    ):
        n, layer = (1, ()) if rows is None else (2, (4,))  # a layer's state of 4 slots
        conv_state = torch.empty(*layer, channels, width - 1, device="meta")
        conv.apply(
            torch.empty(n, channels, device="meta"),
            conv_state,
            torch.empty(channels, width, device="meta"),
            rows,
            starts,
        )
        qk = torch.empty(n, heads, key_dim, device="meta")
        v, gates = torch.empty(n, heads, value_dim, device="meta"), torch.empty(n, heads, device="meta")
        state = torch.empty(*layer, heads, key_dim, value_dim, device="meta")
        delta.apply(qk, qk, v, gates, gates, state, key_dim**-0.5, rows, 1e-6, parameters, True, starts)
        # the output gate, RMSNorm(out) * silu(z), on the projection's z (a part of its rows: strided)
        z = torch.empty(n, 2 * heads * value_dim, device="meta")[:, : heads * value_dim]
        output_gate.apply(v, z.reshape(n, heads, value_dim), torch.empty(value_dim, device="meta"), 1e-6)


# router choices of the reference MoE models: (experts, chosen per token) of Qwen3.5-35B-A3B and Qwen3-Next
REFERENCE_ROUTERS = ((256, 8), (512, 10))


def routing_examples(options: KernelOptions) -> Iterator[str]:
    """The MoE router's choice (softmax, top k, renormalised) on the reference routers' logits, with the
    shared expert's id as one more assignment too (decode), and the combination of the chosen experts'
    results (hidden size 2048) with and without a shared expert."""
    launch = DependentLaunch(options.dependent_launch)
    route, combine = TritonMoeRoute(launch), TritonMoeCombine(launch)
    yield "float32"
    for experts, k in REFERENCE_ROUTERS:
        route.apply(torch.empty(1, experts, device="meta"), k, True)
        route.apply(torch.empty(1, experts, device="meta"), k, True, extra=experts)
        y, weights = torch.empty(k, 2048, device="meta"), torch.empty(1, k, device="meta")
        combine.apply(y, weights)
        combine.apply(y, weights, torch.empty(1, 2048, device="meta"), torch.empty(1, 1, device="meta"))


# in the order `gufo kernels own` records them (the first launch of a configuration is the one compiled)
LAUNCH_EXAMPLES: tuple[Callable[[KernelOptions], Iterator[str]], ...] = (
    linear_examples,
    prefill_tile_examples,
    decode_candidate_examples,
    expert_decode_examples,
    expert_prefill_examples,
    attention_examples,
    prefill_attention_examples,
    elementwise_examples,
    recurrent_examples,
    routing_examples,
)

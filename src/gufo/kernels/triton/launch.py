"""Launch policy of the skinny products (M = 1..MAX_BLOCK_M activation rows): which kernel of
gemv_kernels / gemv_int8 runs, its tile shape, its split of K, and the launch itself (`gemv`).

  - float32 activations, or fewer than DOT_MIN_ROWS rows: the vector kernels, on int8 activations
    (gemv_int8) for the INT8_FORMATS on matrices of at least `int8_min_weights` weights;
  - float16/bfloat16 activations with DOT_MIN_ROWS..16 rows on NVIDIA: the tensor-core kernels,
    BLOCK_M = 16 (on ROCm that tile spilled registers on gfx1151, so AMD keeps the vector path until
    it is tuned);
  - with `tensor_rows` (KernelOptions.row_products = "tensor"), int8 activations of 1..MAX_TENSOR_ROWS
    rows of the TENSOR_ROW_FORMATS on NVIDIA: rows_int8's tensor-core tiles, for every row count alike
    (AMD keeps the vector path, as above);
  - with `half_rows` (KernelOptions.row_products = "f16", whose weights are all F16), 1..MAX_HALF_ROWS
    rows on NVIDIA: rows_half's product of a fixed row count on cuBLAS, for every row count alike.
Block sizes are ones that compiled without register spills for sm_90 and gfx1151. M > 16 is the
prefill's (prefill_gemm), except for products on the tensor-core rows (`skinny`).

Expert-indexed products (`ExpertRows`, the MoE decode step): the weight is a stack of experts and each
activation row multiplies the rows of the expert its device-side id names, read in place from the stack
by the vector kernels (their INDEXED programs: jit_helpers.vector_program), one program row per
assignment; no copy of the chosen experts, and no id read on the host, so CUDA graphs capture it.

Split-K, for matrices with too few row tiles to fill the GPU: the K steps are cut into `splits`
ranges, one per program along grid axis 1, writing float32 partials [splits, M, N] that are summed
afterwards; deterministic (no atomics), so repeated runs give identical tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
from gguf import GGMLQuantizationType

from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.triton import gemv_int8, rows_half, rows_int8
from gufo.kernels.triton.checks import check_device, check_dtype, check_size
from gufo.kernels.triton.dependent_launch import DependentLaunch
from gufo.kernels.triton.gemv_kernels import FORMATS
from gufo.kernels.triton.planes import TritonWeight

Q = GGMLQuantizationType

DOT_MIN_ROWS = 4  # from here on half-precision activations go through tl.dot (tensor cores)
MAX_BLOCK_M = 16
VECTOR_BLOCK_M = (
    4  # activation rows per program of the vector kernels (unrolled: each adds one FMA per weight)
)
MAX_SPLITS = 16
MAX_ASSIGNMENTS = 64  # expert assignments of one expert-indexed product: tokens x top-k of small batches
# BLOCK_N of the tl.dot path: compiled without register spills for sm_90 with Triton 3.6 and 4 warps,
# checked offline with `gufo kernels report` on the Triton cache.
DOT_BLOCK_N = 32
NUM_WARPS = 4
ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(frozen=True)
class ExpertRows:
    """The expert-indexed form of a product (`gemv(..., experts=...)`): the weight is a stack of experts
    of `rows` rows each, and activation row s (or the one row, for every s) multiplies expert ids[s]."""

    ids: torch.Tensor  # [S] expert ids (int32/int64) on the weight's device, 1 <= S <= MAX_ASSIGNMENTS
    rows: int  # rows of one expert: the product is [S, rows]

    def expert_weight(self, weight: TritonWeight) -> TritonWeight:
        """The stack's planes with one expert's shape: what the launch decisions (int8, tile shape) are
        taken by, so each product multiplies as the plain product on that expert's matrix does."""
        n, k = weight.shape
        if self.rows <= 0 or n % self.rows:
            raise ValueError(
                f"expert-indexed product: {n} weight rows are no stack of {self.rows}-row experts"
            )
        return TritonWeight(weight.qtype, (self.rows, k), weight.planes)

    def check(self, rows: int) -> int:
        """The number of assignments S, for activations of `rows` rows (1 or S)."""
        if self.ids.dim() != 1 or self.ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(
                f"expert ids: expected 1-D int32/int64, got {self.ids.dtype} {list(self.ids.shape)}"
            )
        s = self.ids.shape[0]
        if not 0 < s <= MAX_ASSIGNMENTS or rows not in (1, s):
            raise ValueError(f"expert-indexed product: {s} assignments for {rows} activation rows")
        return s


def _splits(device: torch.device, tiles: int, n_steps: int) -> int:
    """Enough K splits for about two programs per multiprocessor (1 off the GPU). `tiles` counts the
    output-row tiles only: the split, hence each row's summation order, must not depend on how many
    activation rows there are, so that M rows give each row's M = 1 numbers (batch invariance)."""
    if device.type != "cuda":
        return 1
    return max(1, min(n_steps, MAX_SPLITS, 2 * _multiprocessors(device) // tiles))


def split_ranges(splits: int, n_steps: int) -> tuple[int, int]:
    """(K steps per split, splits) for about `splits` ranges of `n_steps` steps, none of them empty."""
    per_split = triton.cdiv(n_steps, max(1, min(splits, n_steps)))
    return per_split, triton.cdiv(n_steps, per_split)


@dataclass(frozen=True)
class VectorConfig:
    block_n: int  # output rows per program
    step: int  # input columns per loop step
    num_warps: int


# Widest K step of the vector kernels: 2048 columns, except Q4_0, whose one-row 2048 step compiled with
# a 40-byte stack frame for sm_90 with Triton 3.6 (`gufo kernels own --target sm_90`); 1024 has none.
MAX_VECTOR_STEP = {Q.Q4_0: 1024}


def vector_config(qtype: GGMLQuantizationType, n: int, k: int) -> VectorConfig:
    """Launch shape of the vector kernel for an [n, k] weight: 4 rows x 2048 columns per step
    (docs/decisions.md, "Vector launch shapes")."""
    widest = MAX_VECTOR_STEP.get(qtype, 2048)
    return VectorConfig(4, max(FORMATS[qtype].block, min(widest, triton.next_power_of_2(k))), 4)


INT8_FORMATS = tuple(gemv_int8.KERNELS)  # vector products on int8 activations (gemv_int8.py)


@dataclass(frozen=True)
class DecodeConfig:
    """Launch of an int8 vector product (gemv_int8): its tile, warps, K split and decoding switches."""

    block_n: int  # output rows per program
    step: int  # input columns per loop step (cut to the matrix's width, rounded up to a power of 2)
    num_warps: int
    splits: int | None = None  # K ranges (split-K); None: `_splits`, from the device's size
    decoding: gemv_int8.Decoding = gemv_int8.Decoding()


# The int8 products' launch by format: (for matrices taller than wide, n > k: gate/up, qkv; for the
# others: down, attention output); docs/decisions.md, "int8 product shapes". Q8_0 stays at 1024 columns:
# its 2-row 2048 step compiled with an 8-byte stack frame for sm_90 (Triton 3.6). The IQ formats' entries
# are the winners of `scripts/gemv_bandwidth.py --sweep` on the H200 (decode_candidates.py), IQ2_XXS
# still Q4_K's (no candidate beat it); IQ4_NL stays at 1024 columns: its 2-row 4 x 2048 tile compiled
# with an 8-byte stack frame for sm_90 (Triton 3.6).
_Q4_K_SHAPES = (DecodeConfig(8, 2048, 4), DecodeConfig(4, 2048, 4))
INT8_SHAPES: dict[GGMLQuantizationType, tuple[DecodeConfig, DecodeConfig]] = {
    Q.Q8_0: (DecodeConfig(4, 1024, 2), DecodeConfig(4, 1024, 2)),
    Q.Q4_K: _Q4_K_SHAPES,
    Q.Q6_K: (DecodeConfig(8, 2048, 4), DecodeConfig(8, 2048, 4)),
    Q.IQ4_NL: (DecodeConfig(4, 1024, 4), DecodeConfig(4, 1024, 4)),
    Q.IQ4_XS: (DecodeConfig(4, 2048, 2), DecodeConfig(4, 2048, 2)),
    Q.IQ3_S: (DecodeConfig(4, 2048, 2), DecodeConfig(4, 2048, 4)),
    Q.IQ3_XXS: (DecodeConfig(4, 1024, 4), DecodeConfig(4, 2048, 4)),
    Q.IQ2_XXS: _Q4_K_SHAPES,
}


def int8_config(qtype: GGMLQuantizationType, n: int, k: int) -> DecodeConfig:
    """Launch of the int8 kernel for an [n, k] weight: its INT8_SHAPES entry."""
    tall, wide = INT8_SHAPES[qtype]
    return fitted(qtype, tall if n > k else wide, k)


def fitted(qtype: GGMLQuantizationType, config: DecodeConfig, k: int) -> DecodeConfig:
    """config with its step cut to k columns (rounded up to a power of 2), a block of the format at least."""
    return replace(config, step=max(FORMATS[qtype].block, min(config.step, triton.next_power_of_2(k))))


TENSOR_ROW_FORMATS = tuple(rows_int8.KERNELS)  # int8 rows on the tensor cores (rows_int8.py)
MAX_TENSOR_ROWS = rows_int8.MAX_TENSOR_ROWS
# (BLOCK_N, num_warps) of rows_int8 by format, one super-block (256 columns) per K step: compiled without
# scratch for sm_90 (`gufo kernels own --target sm_90`). Products of more than TENSOR_NARROW_ROWS rows take
# TENSOR_WIDE_TILES where a format has one (docs/decisions.md, "Tensor-core decode rows": measured on the
# H200). A row's numbers do not depend on the tile's width: the float part is elementwise, and the K
# splits are counted on TENSOR_TILES' width whatever tile runs (`tensor_split_tiles`).
TENSOR_TILES = {Q.Q8_0: (64, 4), Q.Q4_K: (64, 4), Q.Q6_K: (64, 4)}
TENSOR_WIDE_TILES = {Q.Q4_K: (128, 4)}
TENSOR_NARROW_ROWS = 8
TENSOR_STEP = 256


def tensor_config(qtype: GGMLQuantizationType, rows: int) -> VectorConfig:
    """Launch shape of rows_int8's kernel for `rows` rows and a weight of a TENSOR_ROW_FORMATS format."""
    wide = rows > TENSOR_NARROW_ROWS and qtype in TENSOR_WIDE_TILES
    block_n, warps = (TENSOR_WIDE_TILES if wide else TENSOR_TILES)[qtype]
    return VectorConfig(block_n, TENSOR_STEP, warps)


def tensor_split_tiles(qtype: GGMLQuantizationType, n: int) -> int:
    """The output tiles `_splits` counts for a tensor-rows product of an [n, k] weight: those of
    TENSOR_TILES' width for every row count, so that the K splits, hence each row's summation order, are
    the same on the narrow and the wide tiles."""
    return triton.cdiv(n, TENSOR_TILES[qtype][0])


MAX_HALF_ROWS = rows_half.MAX_HALF_ROWS


def runs_on_int8(weight: TritonWeight, int8_min_weights: int) -> bool:
    """Whether the products of this weight on float32 activations quantize them to int8 first
    (gemv_int8.py): a format with int8 kernels, whose dot4 is native (NVIDIA) or emulated by the Triton
    interpreter (CPU tensors), and a matrix of at least `int8_min_weights` weights (KernelOptions;
    docs/decisions.md, "int8 activations only for large matrices")."""
    n, k = weight.shape
    return weight.qtype in INT8_FORMATS and torch.version.hip is None and n * k >= int8_min_weights


def int8_activations(x: torch.Tensor, weight: TritonWeight, int8_min_weights: int) -> bool:
    """Whether the vector product of x and weight runs on int8 activations: float32 x (what the engine
    decodes with) and a weight that `runs_on_int8`."""
    return x.dtype == torch.float32 and runs_on_int8(weight, int8_min_weights)


def takes_int8_rows(
    weight: TritonWeight, rows: int, int8_min_weights: int, tensor_rows: bool = False
) -> bool:
    """Whether a product of `rows` float32 rows runs on int8 activations, so the kernel that makes its
    input may hand it `Int8Rows` (the fused norms and activation) instead of float32 rows."""
    return runs_on_int8(weight, int8_min_weights) and rows > 0 and skinny(weight, rows, True, tensor_rows)


def on_tensor_rows(weight: TritonWeight, rows: int, int8: bool, tensor_rows: bool) -> bool:
    """Whether a product of `rows` rows runs on rows_int8's tensor-core tiles: with `tensor_rows`, int8
    activations (`int8`: float32 rows that `int8_activations`, or `Int8Rows`) of a TENSOR_ROW_FORMATS
    weight, 1..MAX_TENSOR_ROWS rows, on NVIDIA (or the CPU interpreter)."""
    return (
        tensor_rows
        and int8
        and weight.qtype in TENSOR_ROW_FORMATS
        and 0 < rows <= MAX_TENSOR_ROWS
        and torch.version.hip is None
    )


def on_half_rows(weight: TritonWeight, rows: int, half_rows: bool) -> bool:
    """Whether a product of `rows` float rows runs on rows_half's fixed-shape float16 product: with
    `half_rows`, an F16 weight, 1..MAX_HALF_ROWS rows, on NVIDIA (or the CPU, in tests)."""
    return (
        half_rows
        and weight.qtype in rows_half.HALF_ROW_FORMATS
        and 0 < rows <= MAX_HALF_ROWS
        and torch.version.hip is None
    )


def skinny(weight: TritonWeight, rows: int, int8: bool, tensor_rows: bool, half_rows: bool = False) -> bool:
    """Whether a product of `rows` rows (on int8 activations: `int8`) takes the skinny products (`gemv`)
    rather than the prefill route: up to MAX_BLOCK_M rows, and up to MAX_TENSOR_ROWS on the tensor-core
    rows (`on_tensor_rows`) or MAX_HALF_ROWS on the float16 ones (`on_half_rows`): decode steps of that
    many rows stay batch-invariant."""
    return (
        rows <= MAX_BLOCK_M
        or on_tensor_rows(weight, rows, int8, tensor_rows)
        or (not int8 and on_half_rows(weight, rows, half_rows))
    )


def check_operands(x: torch.Tensor | Int8Rows, weight: TritonWeight) -> None:
    """x [..., K] as a product with weight takes it: raises naming the mismatch."""
    if weight.qtype not in FORMATS:
        raise ValueError(f"no Triton product for {weight.qtype.name} weights")
    n, k = weight.shape
    if isinstance(x, Int8Rows):
        check_dtype("int8 rows", x.values, (torch.int8,))
        check_size("int8 rows' dimensions", x.values.dim(), 2)
        if weight.qtype not in INT8_FORMATS:
            raise ValueError(f"int8 rows given to a {weight.qtype.name} product, which has no int8 kernel")
    else:
        check_dtype("activations", x, ACTIVATION_DTYPES)
    check_size(f"activation columns of a product with a {n}x{k} weight", x.shape[-1], k)
    if weight.planes:
        check_device("the activations", x.values if isinstance(x, Int8Rows) else x, weight.planes[0].device)


def gemv(
    x: torch.Tensor | Int8Rows,
    weight: TritonWeight,
    int8_min_weights: int,
    launch: DependentLaunch,
    splits: int | None = None,
    tensor_rows: bool = False,
    config: DecodeConfig | None = None,
    experts: ExpertRows | None = None,
    half_rows: bool = False,
) -> torch.Tensor:
    """x [..., K] (float32/float16/bfloat16, on the weight's device; or float32 rows already quantized
    to `Int8Rows` for a format in INT8_FORMATS) -> x @ W^T [..., N] in x's dtype.

    `int8_min_weights`: see `runs_on_int8`; `splits`: number of K ranges (split-K); None picks one from
    the device's size; `tensor_rows`: int8 rows on the tensor cores (`on_tensor_rows`); `config`: the
    launch of a product on the int8 vector kernels instead of `int8_config`'s (the bandwidth sweep's
    candidates; `fitted` to K here), an error on any other path; `experts`: the expert-indexed product
    of x [S or 1, K] -> [S, rows] (`ExpertRows`), on the vector kernels; `half_rows`: float rows of an
    F16 weight in rows_half's fixed-shape float16 product (`on_half_rows`).
    """
    check_operands(x, weight)
    if splits is not None and splits < 1:
        raise ValueError(f"split-K: {splits} splits, expected 1 or more")
    if experts is not None:
        weight = experts.expert_weight(weight)
    n, k = weight.shape
    fmt = FORMATS[weight.qtype]
    quantized = isinstance(x, Int8Rows)
    dtype = torch.float32 if quantized else x.dtype
    lead = x.shape[:-1]
    x2 = x if quantized else x.reshape(-1, k)
    if not quantized and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    indexed = experts is not None
    if indexed:
        assignments = experts.check(m)
        if m < assignments:  # one row for every assignment: read again by each (row stride 0)
            if quantized:
                raise ValueError(f"expert-indexed product: one int8 row for {assignments} assignments")
            x2 = x2.expand(assignments, k)
        lead, m = (assignments,), assignments
    tensor = not indexed and on_tensor_rows(
        weight, m, quantized or int8_activations(x, weight, int8_min_weights), tensor_rows
    )
    half = not (indexed or quantized) and on_half_rows(weight, m, half_rows)
    if config is not None and (half or tensor):  # the vector kernels' launch, not the rows' tiles
        raise ValueError("a DecodeConfig given to a product off the int8 vector kernels")
    if half:
        return rows_half.product(x2, weight.planes[0]).to(dtype).reshape(*lead, n)
    ids: tuple[torch.Tensor | None, ...] = ()  # the vector kernels' ids_ptr (None: not indexed)
    # ROCm: the tl.dot tile spilled to scratch on gfx1151 in every size tried, so AMD stays on the vector path
    if tensor:
        tile = tensor_config(weight.qtype, m)
        kernel, block_n, step, warps = None, tile.block_n, tile.step, tile.num_warps
        block_m, int8 = rows_int8.BLOCK_M, True
    elif dtype != torch.float32 and m >= DOT_MIN_ROWS and torch.version.hip is None and not indexed:
        kernel, block_m, block_n, step, warps = fmt.dot_kernel, MAX_BLOCK_M, DOT_BLOCK_N, fmt.step, NUM_WARPS
        int8 = False
    else:
        int8 = quantized or int8_activations(x, weight, int8_min_weights)
        chosen = int8_config(weight.qtype, n, k) if int8 else vector_config(weight.qtype, n, k)
        if int8 and config is not None:
            chosen = fitted(weight.qtype, config, k)
            splits = config.splits if splits is None else splits
        kernel, block_n, step, warps = fmt.kernel, chosen.block_n, chosen.step, chosen.num_warps
        ids = (experts.ids if indexed else None,)
        # indexed: one assignment per program row (grid axis 2), its expert's rows for the tiles
        block_m = 1 if indexed else min(VECTOR_BLOCK_M, triton.next_power_of_2(max(m, 1)))
    if config is not None and not int8:
        raise ValueError("a DecodeConfig given to a product off the int8 vector kernels")
    grid_n, grid_m = triton.cdiv(n, block_n), triton.cdiv(m, block_m)
    n_steps = triton.cdiv(k, step)
    if splits is None:  # indexed: one expert's split, whatever the assignments (batch invariance)
        splits = _splits(x.device, tensor_split_tiles(weight.qtype, n) if tensor else grid_n, n_steps)
    per_split, splits = split_ranges(splits, n_steps)
    out = torch.empty(splits, m, n, dtype=dtype if splits == 1 else torch.float32, device=x.device)
    if m and tensor:
        rows = x2 if quantized else gemv_int8.quantize_rows(x2, launch)
        rows_int8.launch(
            rows, weight.qtype, weight.planes, out, (grid_n, splits, grid_m), n_steps, per_split, block_n,
            step, warps, launch.options(out.device),
        )  # fmt: skip
    elif m and int8:
        grid = (grid_n, splits, grid_m)
        gemv_int8.launch(
            x2, weight.qtype, weight.planes, out, grid, n_steps, per_split, block_m, block_n, step, warps,
            launch, chosen.decoding, *ids,
        )  # fmt: skip
    elif m:
        kernel[(grid_n, splits, grid_m)](
            x2, *weight.planes, out, m, n, k, x2.stride(0), n_steps, per_split, *ids,
            BLOCK_M=block_m, BLOCK_N=block_n, STEP=step, num_warps=warps, **launch.options(out.device),
            **({"INDEXED": True} if indexed else {}),
        )  # fmt: skip
    y = out[0] if splits == 1 else out.sum(0).to(dtype)
    return y.reshape(*lead, n)

"""A candidate for the tensor-core decode rows (issue 23), measured before it goes into the library:
Q4_K products of M int8 activation rows on float16 operands, accumulated by the MMA itself. Q6_K's went
in (rows_int8.rows_q6_k_f16: faster at every row count); Q4_K's loses at one row (docs/BENCHMARKS.md,
"H200, 2026-12-04 (first lease)"), so it stays here, timed against the tensor route.

rows_int8's Q4_K tile multiplies int8 values and then spends float instructions on every output of
every 32-column block (its scales, the minimums), which is what bounds it (docs/decisions.md,
"Tensor-core decode rows"). Here each 32-column block's weights are dequantized with their scale and
minimum to float16 (d * scale * q - dmin * min, rounded once), the rows' int8 values times their scale
to float16, and `tl.dot(x, w, acc)` accumulates in float32: no float instruction per output and
block, and a tile of BLOCK_M rows shares one dequantization. Every row goes through the same tile
arithmetic whatever M is (batch invariance by construction; the K splits are launch._splits' of the
64-column tiles, as on the tensor route).

    python scripts/rows_f16_candidate.py --device cpu            # the interpreter: checks, tiny shapes
    python scripts/rows_f16_candidate.py --json rows-f16.json    # an H200: checks, then the timings

The checks, on a GPU: rows in products of 1, 5, 16 and 64 rows bit for bit alike, per tile height, and
within float16 rounding of a float64 oracle (the `gguf` package's dequantized weights times the rows'
int8 values). The interpreter checks the oracle only: its float16 `tl.dot` is numpy's, whose sums are
not the MMA's (rows came out 1 ulp apart there by the other rows' contents). The timings: microseconds
per product in a CUDA graph with no L2 reuse, against the tensor route (`--row-products tensor`) on
Qwen3-8B's shapes.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from gemv_bandwidth import copies_for, median_seconds, random_weight, use_device

# the interpreter on "cpu": chosen before triton is imported, as it decides at decoration
use_device("cpu" if "--device=cpu" in sys.argv or "--device cpu" in " ".join(sys.argv) else "cuda")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gufo.kernels.triton.gemv_int8 import _q4_k_chunk_scales  # noqa: E402
from gufo.kernels.triton.jit_helpers import store_partials, vector_program  # noqa: E402
from gufo.kernels.triton.rows_int8 import _x_block  # noqa: E402

SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288)]  # (N, K): attention output, gate/up, down
TINY_SHAPES = [(72, 512)]
FORMATS = ["Q4_K"]
ROWS = [1, 16, 32, 64]
TILES = [(16, 64, 4), (32, 64, 4), (64, 64, 4), (16, 128, 4), (32, 128, 8), (64, 128, 8)]  # BM, BN, warps
TINY_TILES = [(16, 64, 4), (32, 64, 4)]
ORACLE_REL = 2e-3  # both operands rounded to float16 (2^-11 each), relative to |x| @ |W|^T
REP_MS = 10


@triton.jit
def _program(N, M, n_steps, steps_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """As rows_int8's tiles: output rows n and their weight rows, the split's K steps, activation rows m."""
    n, row, split, first, last = vector_program(N, n_steps, steps_per_split, BLOCK_N, False, None, False)
    return n, row, split, first, last, tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)


@triton.jit
def _x_f16(xq_ptr, xd_ptr, m, M, K, blk):
    """The rows' int8 values of 32-column block blk (rows_int8's tile) times their scale, in float16."""
    x, xd = _x_block(xq_ptr, xd_ptr, m, M, K, blk)
    return (x.to(tl.float32) * xd).to(tl.float16)


@triton.jit
def rows_q4_k_f16(
    xq_ptr, xd_ptr, d_ptr, dmin_ptr, scales_ptr, qs_ptr, out_ptr, M, N, K, n_steps, steps_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    n, row, split, first, last, m = _program(N, M, n_steps, steps_per_split, BLOCK_M, BLOCK_N)
    n_super = K // 256
    i = tl.arange(0, 32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for sb in range(first, last):  # one super-block (256 columns) per K step
        d = tl.load(d_ptr + row * n_super + sb).to(tl.float32)
        dmin = tl.load(dmin_ptr + row * n_super + sb).to(tl.float32)
        for c in tl.static_range(4):
            w = tl.load(qs_ptr + row[None, :] * (n_super * 128) + sb * 128 + c * 32 + i[:, None])
            words = scales_ptr + row * (n_super * 3) + sb * 3
            sc_low, min_low, sc_high, min_high = _q4_k_chunk_scales(words, c)
            for half in tl.static_range(2):
                blk = 8 * sb + 2 * c + half
                sc, minimum = (sc_high, min_high) if half else (sc_low, min_low)
                q = ((w >> (4 * half)) & 15).to(tl.float32)
                wf = (q * (d * sc)[None, :] - (dmin * minimum)[None, :]).to(tl.float16)
                acc = tl.dot(_x_f16(xq_ptr, xd_ptr, m, M, K, blk), wf, acc)
    store_partials(out_ptr, acc, m, n, M, N, split)


def product(rows: Any, weight: Any, tile: tuple[int, int, int]) -> Any:
    """x [M, K] (Int8Rows) @ W^T [N, K] on the candidate, tile (BLOCK_M, BLOCK_N, warps)."""
    import torch

    from gufo.kernels.triton import launch

    block_m, block_n, warps = tile
    m, k = rows.values.shape
    n = weight.shape[0]
    n_steps = k // 256
    tiles = launch.tensor_split_tiles(weight.qtype, n)
    per_split, splits = launch.split_ranges(launch._splits(rows.values.device, tiles, n_steps), n_steps)
    out = torch.empty(splits, m, n, dtype=torch.float32, device=rows.values.device)
    grid = (triton.cdiv(n, block_n), splits, triton.cdiv(m, block_m))
    d, dmin, scales, qs = weight.planes
    rows_q4_k_f16[grid](
        rows.values, rows.scales, d, dmin, scales.view(torch.int32), qs, out, m, n, k, n_steps, per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
    )  # fmt: skip
    return out.sum(0) if splits > 1 else out[0]


def checks(info: Any, weight: Any, device: str, tiles: list, counts: tuple) -> list[dict]:
    import gguf
    import numpy as np
    import torch

    from gufo.kernels.int8_rows import Int8Rows
    from gufo.kernels.triton.dependent_launch import DependentLaunch
    from gufo.kernels.triton.gemv_int8 import quantize_rows

    n, k = info.shape
    base = {"format": info.qtype.name, "N": n, "K": k}
    x = quantize_rows(torch.randn(max(counts), k, generator=torch.Generator().manual_seed(1)).to(device),
                      DependentLaunch(enabled=False))  # fmt: skip
    w = torch.from_numpy(gguf.quants.dequantize(info.data, info.qtype).astype(np.float64))
    xd = x.values.cpu().double() * x.scales.cpu().double().repeat_interleave(32, -1)
    want, bound = xd @ w.T, ORACLE_REL * (xd.abs() @ w.abs().T) + 1e-30
    results = []
    for tile in tiles:
        alone = torch.cat([product(Int8Rows(*(t[i : i + 1] for t in x)), weight, tile)
                           for i in range(max(counts))])  # fmt: skip
        for per in counts if device == "cuda" else ():
            parts = [product(Int8Rows(*(t[i : i + per] for t in x)), weight, tile)
                     for i in range(0, max(counts), per)]  # fmt: skip
            same = bool(torch.equal(torch.cat(parts), alone))
            results.append(base | {"tile": tile, "check": f"rows_alike_m{per}", "pass": same})
        near = bool(((alone.cpu().double() - want).abs() <= bound).all())
        results.append(base | {"tile": tile, "check": "oracle", "pass": near})
    return results


def timings(info: Any, weights: list, device: str, tiles: list) -> list[dict]:
    import torch

    from gufo.kernels.triton import launch
    from gufo.kernels.triton.dependent_launch import DependentLaunch
    from gufo.kernels.triton.gemv_int8 import quantize_rows

    n, k = info.shape
    base = {"format": info.qtype.name, "N": n, "K": k}
    found = []
    plain = DependentLaunch(enabled=True)
    for m in ROWS:
        rows = quantize_rows(torch.randn(m, k, device=device), DependentLaunch(enabled=False))
        tensor = [lambda w=w, x=rows: launch.gemv(x, w, 0, plain, tensor_rows=True) for w in weights]
        us = median_seconds(tensor, device, REP_MS) * 1e6
        found.append(base | {"M": m, "route": "tensor", "us": us})
        for tile in tiles:
            calls = [lambda w=w, t=tile, x=rows: product(x, w, t) for w in weights]
            us = median_seconds(calls, device, REP_MS) * 1e6
            found.append(base | {"M": m, "route": "f16", "tile": tile, "us": us})
        for row in found[-1 - len(tiles) :]:
            print(json.dumps(row), flush=True)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the interpreter")
    parser.add_argument("--json", type=Path, help="also write the checks and timings to this file")
    args = parser.parse_args()
    import torch

    from gufo.kernels.triton.planes import upload

    tiny = args.device == "cpu"
    results: list[dict] = []
    for name, (n, k) in itertools.product(FORMATS, TINY_SHAPES if tiny else SHAPES):
        info = random_weight(name, n, k)
        copies = 1 if tiny else copies_for(info.data.nbytes)
        weights = [upload(info, torch.device(args.device)) for _ in range(copies)]
        counts = (1, 3, 16, 20) if tiny else (1, 5, 16, 64)  # rows per product (checked on a GPU only)
        for row in checks(info, weights[0], args.device, TINY_TILES if tiny else TILES, counts):
            print(("PASS" if row["pass"] else "FAIL"), json.dumps(row), flush=True)
            results.append(row)
        if not tiny:
            results += timings(info, weights, args.device, TILES)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(r.get("pass", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

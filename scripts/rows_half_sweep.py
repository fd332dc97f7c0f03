"""Launch shapes of the float16 decode rows (`rows_half.rows_f16`, `--row-products f16`): microseconds per
product of M = 1..512 rows on Qwen3-8B's shapes for each candidate (BLOCK_M, BLOCK_N, STEP, num_warps,
num_stages) and each activation dtype the kernel reads (float32, converted in the kernel as the engine
runs it today; or float16, rounded before the launch in one pass: the same float16 values, half the
bytes each weight tile's program reads), next to cuBLAS on the same float16 operands (what prefill
runs: the speed a batch-invariant tile would have to approach to take prefill too), with a check per
candidate that rows in products of 1, 16 and 64 rows are bit for bit alike.

Why: past 16 rows the route's step grows ~0.21 ms a row on the 8B file (docs/decisions.md, "Float16 decode
rows"), while the weight bytes it reads do not change; every program of an output tile reads the rows'
activations again for each weight tile, in float32, twice the weight tile's bytes at BLOCK_N = 64.

    python scripts/rows_half_sweep.py --json rows_half_sweep.json     # a GPU, a few minutes
    python scripts/rows_half_sweep.py --device cpu --tiny              # smoke check: the interpreter

Weights: random valid Q4_K blocks dequantized to float16 as `TritonLinear.prepare` does, several copies
read in turn so that the L2 holds none (gemv_bandwidth.median_seconds). The K split is `launch._splits`'
for the candidate's output tiles (what the launch would give it). Prints one JSON row per timing, then
PASS/FAIL per candidate and shape; exit 1 on a FAIL.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gemv_bandwidth import copies_for, median_seconds, random_weight, use_device

SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288), (151936, 4096)]  # (N, K)
TINY_SHAPES = [(72, 512)]
ROWS = [1, 16, 32, 64, 256, 512]
TINY_ROWS = [1, 16]
# (BLOCK_M, BLOCK_N, STEP, num_warps, num_stages): the kernel as it runs (rows_half.BLOCK_M, HALF_TILE),
# then wider output tiles (the activations read once for more weight rows), deeper pipelines (more weight
# bytes in flight per program: a one-row product is bound by them), and both
CANDIDATES = [
    (64, 64, 128, 4, 3),
    (64, 64, 64, 4, 5),
    (64, 128, 64, 4, 3),
    (64, 128, 64, 4, 4),
    (64, 128, 64, 8, 4),
    (64, 128, 128, 4, 3),
    (64, 256, 64, 8, 3),
]
TINY_CANDIDATES = [(64, 64, 128, 4, 3), (16, 64, 128, 4, 3)]
REP_MS = 10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the interpreter")
    parser.add_argument("--tiny", action="store_true", help=f"tiny shapes {TINY_SHAPES} (smoke check)")
    parser.add_argument("--json", help="also write the rows and checks to this file")
    return parser.parse_args()


def product(x: Any, weight: Any, candidate: tuple[int, int, int, int, int]) -> Any:
    """x [M, K] (float32 or float16) @ W^T on rows_f16 with the candidate's launch shape, split-K partials
    summed as `launch.gemv` sums them."""
    import torch
    import triton

    from gufo.kernels.triton import launch, rows_half

    block_m, block_n, step, warps, stages = candidate
    m, k = x.shape
    n = weight.shape[0]
    n_steps = triton.cdiv(k, step)
    grid_n = triton.cdiv(n, block_n)
    per_split, splits = launch.split_ranges(launch._splits(x.device, grid_n, n_steps), n_steps)
    out = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    rows_half.rows_f16[(triton.cdiv(m, block_m), grid_n, splits)](
        x, weight, out, m, n, k, x.stride(0), n_steps, per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, STEP=step, PDL=False, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out[0] if splits == 1 else out.sum(0)


def shape_rows(n: int, k: int, device: str, row_counts: list[int], candidates: list) -> tuple[list, list]:
    import torch

    from gufo.kernels.triton.gemv import TritonLinear
    from gufo.options import KernelOptions

    info = random_weight("Q4_K", n, k)
    dense = TritonLinear(KernelOptions(row_products="f16")).prepare(info, torch.device(device)).planes[0]
    copies = copies_for(dense.numel() * 2) if device == "cuda" else 1
    weights = [dense] + [dense.clone() for _ in range(copies - 1)]
    x = torch.randn(max([*row_counts, 64]), k, generator=torch.Generator().manual_seed(0)).to(device)
    timings, checks = [], []
    for m in row_counts if device == "cuda" else ():  # cuBLAS on the float16 rows: prefill's product
        rows = x[:m].half()
        seconds = median_seconds([lambda w=w, r=rows: r @ w.T for w in weights], device, REP_MS)
        row = {"N": n, "K": k, "M": m, "tile": "cublas", "x": "float16", "us": seconds * 1e6,
               "weight_gbps": dense.numel() * 2 / seconds / 1e9}  # fmt: skip
        print(json.dumps(row), flush=True)
        timings.append(row)
    for candidate in candidates:
        for dtype in (torch.float32, torch.float16):
            for m in row_counts:
                rows = x[:m].to(dtype)
                calls = [lambda w=w, r=rows, c=candidate: product(r, w, c) for w in weights]
                seconds = median_seconds(calls, device, REP_MS)
                row = {"N": n, "K": k, "M": m, "tile": list(candidate), "x": str(dtype)[len("torch."):],
                       "us": seconds * 1e6, "weight_gbps": dense.numel() * 2 / seconds / 1e9}  # fmt: skip
                print(json.dumps(row), flush=True)
                timings.append(row)
        alone = torch.cat([product(x[i : i + 1], dense, candidate) for i in range(64)])
        half = product(x[:64].half(), dense, candidate)
        same = all(
            torch.equal(
                torch.cat([product(x[i : i + per], dense, candidate) for i in range(0, 64, per)]), alone
            )
            for per in (16, 64)
        )
        checks.append({"N": n, "K": k, "tile": list(candidate), "pass": same and torch.equal(half, alone)})
    return timings, checks


def main() -> int:
    args = parse_args()
    use_device(args.device)
    timings, checks = [], []
    candidates = TINY_CANDIDATES if args.tiny else CANDIDATES
    for n, k in TINY_SHAPES if args.tiny else SHAPES:
        rows, results = shape_rows(n, k, args.device, TINY_ROWS if args.tiny else ROWS, candidates)
        timings += rows
        checks += results
    for c in checks:
        print(
            f"{'PASS' if c['pass'] else 'FAIL'} {c['N']}x{c['K']} tile {c['tile']}: rows of 1, 16, 64 alike"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": timings, "checks": checks}, indent=1))
    return 0 if all(c["pass"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())

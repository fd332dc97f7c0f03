"""GPU check: does the prefill product (cuBLAS, float16 operands, float32 out: `prefill_gemm._product`) give
each row the same bits whatever the number of rows M it runs with? If it does on a layer's shapes, the
prompts of several requests could share one prefill pass without moving any row's logits (the
determinism contract); if not, which M change them says where cuBLAS switches kernels.

The same for gufo's own fixed-tile product (`prefill_tiles.product`, batch-invariant by construction) with
each candidate tile shape of `TILE_CANDIDATES`, to see what it costs against cuBLAS.

For each (N, K) of a Qwen3-8B layer and its output, random float16 operands, the product of the first M
rows of one activation matrix for every M listed, each compared with the same rows of the largest M's
product, bit for bit; and the time per product (CUDA events, median of `--reps`), to see what packing
prompts into taller products would save, and (rows 1..64) what decode rows would cost on a float16 copy of
the weights. One JSON object per (product, N, K, M) on stdout.

    python scripts/prefill_rows_invariance.py
    python scripts/prefill_rows_invariance.py --rows 65,128,512,4096 --reps 20
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable

import torch

from gufo.kernels.triton import prefill_tiles

SHAPES = ((4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288), (151936, 4096))  # Qwen3-8B (N, K)
ROWS = (1, 2, 4, 8, 16, 32, 48, 64, 65, 96, 128, 192, 256, 300, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


# BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, splits of K: prefill_tiles.TILES first
# (the launch may differ per weight shape, never per M: small tiles and K splits fill more multiprocessors
# at a few hundred rows, where one prompt's prefill and a server's packed passes run)
TILE_CANDIDATES = (
    (128, 256, 64, 8, 3, 1),
    (128, 128, 64, 8, 3, 1),
    (128, 128, 64, 4, 4, 1),
    (64, 128, 64, 4, 4, 1),
    (64, 256, 64, 8, 3, 1),
    (64, 64, 64, 4, 4, 1),
    (128, 256, 64, 8, 3, 2),
    (128, 256, 64, 8, 3, 4),
    (128, 128, 64, 4, 4, 2),
    (128, 128, 64, 4, 4, 4),
)


def cublas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w.T, out_dtype=torch.float32)


def median_ms(product: Callable, x: torch.Tensor, w: torch.Tensor, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        product(x, w)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts M, comma-separated")
    parser.add_argument("--reps", type=int, default=10, help="timed products per (N, K, M); median reported")
    args = parser.parse_args()
    rows = sorted(int(m) for m in args.rows.split(","))
    generator = torch.Generator(device="cuda").manual_seed(0)
    products = {"cublas": cublas} | {
        "tiles" + "x".join(map(str, tiles)): functools.partial(prefill_tiles.product, tiles=tiles)
        for tiles in TILE_CANDIDATES
    }
    for n, k in SHAPES:
        w = (torch.randn(n, k, device="cuda", generator=generator) * k**-0.5).half()
        x = torch.randn(rows[-1], k, device="cuda", generator=generator).half()
        for name, product in products.items():
            reference = product(x, w)
            for m in rows:
                y = product(x[:m], w)
                diff = float((y - reference[:m]).abs().max())
                equal_rows = int((y == reference[:m]).all(dim=1).sum())
                ms = median_ms(product, x[:m], w, args.reps)
                tflops = round(2 * m * n * k / ms / 1e9, 1)
                record = {"product": name, "N": n, "K": k, "M": m, "equal": equal_rows == m}
                record |= {
                    "equal_rows": equal_rows,
                    "max_abs_diff": diff,
                    "ms": round(ms, 4),
                    "tflops": tflops,
                }
                print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

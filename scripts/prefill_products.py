"""Prefill products (M = hundreds to thousands of rows) on quantized weights: the options side by side.

For Qwen3-8B shapes, times per call (CUDA events, triton.testing.do_bench, median):
  - `torch-dequant`: the earlier route, torch ops dequantize the joined GGUF rows, then a bf16 matmul;
  - `triton-dequant+cublas`: gufo's route now, the Triton dequant kernel writes bf16, then cuBLAS;
  - `dequant-only`: that dequant kernel alone;
  - `fused-tile-MxN`: the tensor-core tile kernels (`gemv_<fmt>_dot`) launched as a fused-dequant GEMM
    with BLOCK_M x BLOCK_N tiles, each program dequantizing its weight tile in registers;
  - `cublas-bf16`: the product alone on an already dequantized bf16 weight (the ceiling of the
    dequant-then-multiply route).
Prints a markdown table (TFLOP/s = 2 M N K / time) and writes the rows with --json. Needs a GPU:

    python scripts/prefill_products.py --formats Q4_K Q6_K Q8_0 --m 512 2048 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
from gguf import GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).parent))
from gemv_bandwidth import SHAPES, random_rows  # noqa: E402  (a sibling script)

from gufo.formats import dequantize  # noqa: E402
from gufo.kernels.triton import gemv  # noqa: E402

Q = GGMLQuantizationType
FUSED_TILES = [(64, 64), (128, 64), (64, 128)]


def fused_tile_product(
    x: torch.Tensor, weight: gemv.TritonWeight, block_m: int, block_n: int
) -> torch.Tensor:
    """The tensor-core tile kernel as a GEMM: one program per (BLOCK_N rows, BLOCK_M activations)."""
    n, k = weight.shape
    fmt = gemv.FORMATS[weight.qtype]
    m = x.shape[0]
    out = torch.empty(1, m, n, dtype=x.dtype, device=x.device)
    n_steps = triton.cdiv(k, fmt.step)
    grid = (triton.cdiv(n, block_n), 1, triton.cdiv(m, block_m))
    fmt.dot_kernel[grid](
        x, *weight.planes, out, m, n, k, x.stride(0), n_steps, n_steps,
        BLOCK_M=block_m, BLOCK_N=block_n, STEP=fmt.step, num_warps=8,
    )  # fmt: skip
    return out[0]


def options(x: torch.Tensor, weight: gemv.TritonWeight) -> dict[str, Callable[[], Any]]:
    n, k = weight.shape
    dense = gemv.dequantize_weight(weight)
    calls: dict[str, Callable[[], Any]] = {
        "torch-dequant": lambda: (
            x
            @ dequantize(weight.qtype, gemv.join_fields(weight.qtype, weight.planes), k).to(torch.bfloat16).T
        ),
        "triton-dequant+cublas": lambda: gemv.TritonLinear.apply(x, weight),
        "dequant-only": lambda: gemv.dequantize_weight(weight),
        "cublas-bf16": lambda: x @ dense.T,
    }
    for block_m, block_n in FUSED_TILES:
        calls[f"fused-tile-{block_m}x{block_n}"] = lambda bm=block_m, bn=block_n: fused_tile_product(
            x, weight, bm, bn
        )
    return calls


def bench(qtype: GGMLQuantizationType, shape: str, m: int) -> list[dict[str, Any]]:
    n, k = SHAPES[shape]
    gen = torch.Generator("cuda").manual_seed(0)
    weight = gemv.TritonWeight(qtype, (n, k), gemv.split_fields(qtype, random_rows(qtype, n, k, gen)))
    x = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    want = x.float() @ gemv.dequantize_weight(weight, torch.float32).T
    rows = []
    for name, call in options(x, weight).items():
        row: dict[str, Any] = {"format": qtype.name, "shape": shape, "M": m, "N": n, "K": k, "option": name}
        try:
            result = call()
            if name != "dequant-only":  # every product must be the same product
                err = ((result.float() - want).norm() / want.norm()).item()
                row["rel_err"] = err
            ms = triton.testing.do_bench(call, warmup=5, rep=40, return_mode="median")
            row["ms"] = ms
            row["TFLOP/s"] = 2 * m * n * k / ms / 1e9
        except Exception as err:  # a tile that does not compile or fit is a result too
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["Q4_K", "Q6_K", "Q8_0"])
    parser.add_argument("--shapes", nargs="+", default=["qkv", "gate_up", "down"], choices=list(SHAPES))
    parser.add_argument("--m", nargs="+", type=int, default=[512, 2048])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = [
        row
        for name in args.formats
        for shape in args.shapes
        for m in args.m
        for row in bench(Q[name], shape, m)
    ]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("| format | shape | M | option | ms | TFLOP/s | rel err |\n|---|---|--:|---|--:|--:|--:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['format']} | {r['shape']} | {r['M']} | {r['option']} | {r['error']} | | |")
        else:
            err = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
            print(f"| {r['format']} | {r['shape']} | {r['M']} | {r['option']} | {r['ms']:.3f} "
                  f"| {r['TFLOP/s']:.0f} | {err} |")  # fmt: skip


if __name__ == "__main__":
    main()

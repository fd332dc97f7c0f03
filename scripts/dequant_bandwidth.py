"""Prefill dequantizer bandwidth per weight format: `prefill_gemm.dequantize_weight(w, float16)` (the
format's Triton dequant kernel, what every prefill product runs first), next to the cuBLAS product of
512 float16 rows with the dequantized matrix (the product `prefill_gemm` runs after it) and the whole
`prefill_product` of 512 float32 rows (activation rounding + dequant + product), so the share of the
dequantizer in a 512-token prefill chunk is visible.

Weights are random valid blocks (gufo.formats.random_blocks) uploaded as the engine uploads them
(`planes.upload`); each timed call reads the next of enough weight copies that the L2 cache holds none
of them. Times: CUDA events around REPEATS calls after a warm-up, the mean per call. GB/s counts the
weight's bytes read (the GGUF bytes, = its planes) plus the float16 matrix written. Prints a JSON list of
rows {format, N, K, dequant_us, dequant_gbps, gemm_us, dequant_per_gemm, product_us} and a markdown
table; --json also writes the rows.

    python scripts/dequant_bandwidth.py --json out.json     # an H200: under a minute
    python scripts/dequant_bandwidth.py --device cpu --tiny  # smoke check: the Triton interpreter
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

from gemv_bandwidth import random_weight, report, use_device

FORMATS = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS"]
SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288)]  # (N, K): Qwen3-8B's attention output, up, down
TINY_SHAPES = [(40, 512)]
TOKENS = 512  # rows of the prefill chunk (the engine's default batch)
TINY_TOKENS = 17  # past launch.MAX_BLOCK_M: the prefill route
L2_BYTES = 60 * 2**20  # H200: 50 MiB; the weight copies read in turn hold several times this
WARMUP, REPEATS = 3, 20


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--formats", nargs="+", default=FORMATS, help=f"GGUF types (default {' '.join(FORMATS)})"
    )
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the Triton interpreter"
    )
    parser.add_argument("--tiny", action="store_true", help=f"tiny shapes {TINY_SHAPES} (smoke check)")
    parser.add_argument("--json", help="also write the rows to this file")
    return parser.parse_args()


def mean_seconds(calls: list[Callable[[], Any]], device: str) -> float:
    """Mean time of one call over REPEATS calls (cycling through `calls`) after WARMUP rounds of all of
    them: CUDA events on a GPU, wall time in the interpreter (one call each)."""
    if device == "cpu":
        start = time.perf_counter()
        for call in calls:
            call()
        return (time.perf_counter() - start) / len(calls)
    import torch

    for _ in range(WARMUP):
        for call in calls:
            call()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for i in range(REPEATS):
        calls[i % len(calls)]()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1e-3 / REPEATS


def bench(qtype_name: str, n: int, k: int, tokens: int, device: str) -> dict[str, Any]:
    import torch

    from gufo.kernels.triton import planes, prefill_gemm
    from gufo.options import KernelOptions

    info = random_weight(qtype_name, n, k)
    blocks = info.data
    copies = max(1, min(16, math.ceil(3 * L2_BYTES / blocks.nbytes))) if device == "cuda" else 1
    weights = [planes.upload(info, torch.device(device)) for _ in range(copies)]
    half = prefill_gemm.PREFILL_DTYPE
    dequant = mean_seconds([lambda w=w: prefill_gemm.dequantize_weight(w, half) for w in weights], device)
    dense = prefill_gemm.dequantize_weight(weights[0], half)
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(tokens, k, device=device, generator=generator)
    x_half = x.to(half)
    if device == "cuda":  # prefill_gemm._product's call: float32 accumulators out
        gemm = mean_seconds([lambda: torch.mm(x_half, dense.T, out_dtype=torch.float32)], device)
    else:
        gemm = mean_seconds([lambda: (x_half @ dense.T).float()], device)
    limit = KernelOptions().int8_min_weights
    product = mean_seconds([lambda w=w: prefill_gemm.prefill_product(x, w, limit) for w in weights], device)
    moved = blocks.nbytes + n * k * dense.element_size()
    return {
        "format": qtype_name,
        "N": n,
        "K": k,
        "tokens": tokens,
        "weight_bytes": blocks.nbytes,
        "dequant_us": dequant * 1e6,
        "dequant_gbps": moved / dequant / 1e9,
        "gemm_us": gemm * 1e6,
        "dequant_per_gemm": dequant / gemm,
        "product_us": product * 1e6,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"prefill chunk: {rows[0]['tokens']} rows" if rows else "",
        "",
        "| format | N x K | dequant us | dequant GB/s | GEMM us | dequant / GEMM | product us |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = (
            r["format"],
            f"{r['N']}x{r['K']}",
            f"{r['dequant_us']:.1f}",
            f"{r['dequant_gbps']:.0f}",
            f"{r['gemm_us']:.1f}",
            f"{r['dequant_per_gemm']:.2f}",
            f"{r['product_us']:.1f}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    use_device(args.device)
    tokens = TINY_TOKENS if args.tiny else TOKENS
    rows = [
        bench(name, n, k, tokens, args.device)
        for name in args.formats
        for n, k in (TINY_SHAPES if args.tiny else SHAPES)
    ]
    report(rows, markdown(rows), args.json)


if __name__ == "__main__":
    main()

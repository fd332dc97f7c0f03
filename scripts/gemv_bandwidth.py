"""Decode product bandwidth per weight format: the one-row product y = x @ W^T (or `--rows` rows: a
batched decode step's) through the engine's Triton kernel (TritonLinear, default KernelOptions), as bytes
of the GGUF weight over the time of one product, next to the device's copy bandwidth (a large tensor
copy: bytes read + written over its time).

Weights are random valid blocks (gufo.formats.random_blocks) uploaded by `TritonLinear.prepare`; each
product is timed inside a CUDA graph (as decode runs them) cycling through enough copies of the weight
that the L2 cache holds none of them (median of triton.testing.do_bench_cudagraph). Prints a JSON list of
rows {format, N, K, path, us, gbps, copy_gbps, fraction_of_copy} and a markdown table (path: the
product's activations, int8 or float32); --json also writes the rows.

    python scripts/gemv_bandwidth.py --json out.json            # a GPU, about a minute
    python scripts/gemv_bandwidth.py --device cpu --tiny         # smoke check: the Triton interpreter
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FORMATS = ["IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS", "Q4_K", "Q6_K", "Q8_0"]
SHAPES = [(4096, 4096), (4096, 12288), (12288, 4096)]  # (N, K): Qwen3-8B's attention output, down, up
TINY_SHAPES = [(8, 512)]
L2_BYTES = 60 * 2**20  # H200: 50 MiB; each timed pass reads several times this
COPY_BYTES = 2**30  # the copy bandwidth's tensor


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--formats", nargs="+", default=FORMATS, help=f"GGUF types (default {' '.join(FORMATS)})"
    )
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the Triton interpreter"
    )
    parser.add_argument(
        "--rows", type=int, default=1, help="activation rows per product, 1..16 (default 1: decode's)"
    )
    parser.add_argument("--tiny", action="store_true", help=f"tiny shapes {TINY_SHAPES} (smoke check)")
    parser.add_argument("--json", help="also write the rows to this file")
    return parser.parse_args()


def use_device(device: str) -> None:
    """On "cpu", the Triton interpreter: set before Triton is first imported (it picks the interpreter at
    decoration), with the test suite's loop-bound fix (Triton 3.6 on numpy 2.4)."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
        from triton_interpreter import fix_interpreter_loop_bounds

        fix_interpreter_loop_bounds()


def copies_for(nbytes: int) -> int:
    """Weight copies read in turn so that the L2 holds none of them when it is read again."""
    return max(1, min(32, math.ceil(3 * L2_BYTES / nbytes)))


def median_seconds(calls: list[Callable[[], Any]], device: str, rep_ms: int = 50) -> float:
    """Median time of one call: replays of a CUDA graph of all the calls on a GPU (about rep_ms of
    them per replay), wall time on the CPU."""

    def run_all() -> None:
        for call in calls:
            call()

    run_all()  # compile before capture
    if device == "cpu":
        times = []
        for _ in range(3):
            start = time.perf_counter()
            run_all()
            times.append(time.perf_counter() - start)
        return statistics.median(times) / len(calls)
    import torch
    import triton

    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(run_all, rep=rep_ms, return_mode="median") * 1e-3 / len(calls)


def copy_gbps(device: str, nbytes: int) -> float:
    """Device copy bandwidth: a tensor of nbytes copied into another, (read + write) bytes per second."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / median_seconds([lambda: dst.copy_(src)], device) / 1e9


def random_weight(qtype_name: str, n: int, k: int) -> Any:
    """A TensorInfo of random valid blocks (gufo.formats.random_blocks) of an [n, k] weight."""
    import numpy as np
    from gguf import GGMLQuantizationType

    from gufo.formats import block_shape
    from gufo.formats.random_blocks import random_blocks
    from gufo.gguf.model_file import TensorInfo

    qtype = GGMLQuantizationType[qtype_name]
    elements, _ = block_shape(qtype)
    blocks = random_blocks(qtype, n * k // elements, np.random.default_rng(0)).reshape(n, -1)
    return TensorInfo("w", qtype, (n, k), 0, blocks.nbytes, blocks)


def bench(qtype_name: str, n: int, k: int, device: str, copy: float, rows: int = 1) -> dict[str, Any]:
    import torch

    from gufo.kernels.triton.gemv import TritonLinear
    from gufo.kernels.triton.launch import int8_activations
    from gufo.options import KernelOptions

    info = random_weight(qtype_name, n, k)
    blocks = info.data
    linear = TritonLinear(KernelOptions())
    copies = copies_for(blocks.nbytes) if device == "cuda" else 1  # no L2 to dodge in the interpreter
    weights = [linear.prepare(info, torch.device(device)) for _ in range(copies)]
    x = torch.randn(rows, k, device=device, generator=torch.Generator(device).manual_seed(0))
    seconds = median_seconds([lambda w=w: linear.apply(x, w) for w in weights], device)
    gbps = blocks.nbytes / seconds / 1e9
    path = "int8" if int8_activations(x, weights[0], linear.int8_min_weights) else "float32"
    return {
        "format": qtype_name,
        "N": n,
        "K": k,
        "rows": rows,
        "path": path,
        "us": seconds * 1e6,
        "gbps": gbps,
        "copy_gbps": copy,
        "fraction_of_copy": gbps / copy,
    }


def report(rows: list[dict[str, Any]], table: str, json_path: str | None) -> None:
    """Print the rows as JSON and their markdown table; also write the JSON to json_path if given."""
    print(json.dumps(rows, indent=1))
    print(table)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1) + "\n")


def markdown(rows: list[dict[str, Any]], copy: float) -> str:
    lines = [
        f"copy bandwidth: {copy:.0f} GB/s",
        "",
        "| format | N x K | path | us | GB/s | of copy |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = (
            r["format"],
            f"{r['N']}x{r['K']}",
            r["path"],
            f"{r['us']:.2f}",
            f"{r['gbps']:.0f}",
            f"{r['fraction_of_copy']:.0%}",
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    use_device(args.device)
    copy = copy_gbps(args.device, 2**24 if args.tiny else COPY_BYTES)
    rows = [
        bench(name, n, k, args.device, copy, args.rows)
        for name in args.formats
        for n, k in (TINY_SHAPES if args.tiny else SHAPES)
    ]
    report(rows, markdown(rows, copy), args.json)


if __name__ == "__main__":
    main()

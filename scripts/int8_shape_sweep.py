"""Launch shapes of the one-row int8 products, swept per format: for each format and matrix shape, the
product's time under each candidate (BLOCK_N, STEP, num_warps) in place of `launch.int8_config`'s, next
to the device's copy bandwidth, timed as scripts/gemv_bandwidth.py times it (CUDA-graph replays over
weight copies that defeat the L2, the activation quantizer included). Prints and --json writes the rows
{format, N, K, block_n, step, warps, current, us, gbps, fraction_of_copy}, then the best
shape per format and matrix; the choice goes into `int8_config` once every row count's tile compiles
without scratch (`gufo kernels own --target sm_90`).

    python scripts/int8_shape_sweep.py --json sweep.json      # an H200: a few minutes
    python scripts/int8_shape_sweep.py --device cpu --tiny     # smoke check: the Triton interpreter
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemv_bandwidth import SHAPES, TINY_SHAPES, copies_for, copy_gbps, median_seconds  # noqa: E402

FORMATS = ["IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_XXS"]
# (BLOCK_N, STEP, num_warps); the current shapes are among them
CANDIDATES = [
    (4, 2048, 4), (8, 2048, 4), (4, 1024, 4), (8, 1024, 4), (2, 2048, 4), (16, 1024, 4),
    (4, 4096, 4), (4, 4096, 8), (8, 2048, 8), (16, 2048, 8), (4, 1024, 2), (8, 512, 2),
]  # fmt: skip
TINY_CANDIDATES = [(4, 256, 4), (8, 256, 2)]


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


def sweep(
    qtype_name: str, n: int, k: int, device: str, copy: float, candidates: list
) -> list[dict[str, Any]]:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType

    from gufo.formats import block_shape
    from gufo.formats.random_blocks import random_blocks
    from gufo.gguf.model_file import TensorInfo
    from gufo.kernels.triton import launch
    from gufo.kernels.triton.gemv import TritonLinear
    from gufo.options import KernelOptions

    qtype = GGMLQuantizationType[qtype_name]
    elements, _ = block_shape(qtype)
    blocks = random_blocks(qtype, n * k // elements, np.random.default_rng(0)).reshape(n, -1)
    info = TensorInfo("w", qtype, (n, k), 0, blocks.nbytes, blocks)
    linear = TritonLinear(KernelOptions(int8_min_weights=0))  # the int8 kernels on the tiny shapes too
    copies = copies_for(blocks.nbytes) if device == "cuda" else 1
    weights = [linear.prepare(info, torch.device(device)) for _ in range(copies)]
    x = torch.randn(1, k, device=device, generator=torch.Generator(device).manual_seed(0))
    current = launch.int8_config(qtype, n, k)
    rows = []
    for block_n, step, warps in candidates:
        config = launch.VectorConfig(block_n, step, warps)
        with mock.patch.object(launch, "int8_config", lambda q, n_, k_, c=config: c):
            seconds = median_seconds([lambda w=w: linear.apply(x, w) for w in weights], device)
        gbps = blocks.nbytes / seconds / 1e9
        rows.append({
            "format": qtype_name, "N": n, "K": k, "block_n": block_n, "step": step, "warps": warps,
            "current": config == current, "us": seconds * 1e6, "gbps": gbps, "fraction_of_copy": gbps / copy,
        })  # fmt: skip
    return rows


def main() -> None:
    args = parse_args()
    if args.device == "cpu":  # before Triton is first imported: it picks the interpreter at decoration
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
        from triton_interpreter import fix_interpreter_loop_bounds  # Triton 3.6 on numpy 2.4

        fix_interpreter_loop_bounds()
    copy = copy_gbps(args.device, 2**24 if args.tiny else 2**30)
    candidates = TINY_CANDIDATES if args.tiny else CANDIDATES
    rows = [
        row
        for name in args.formats
        for n, k in (TINY_SHAPES if args.tiny else SHAPES)
        for row in sweep(name, n, k, args.device, copy, candidates)
    ]
    print(json.dumps(rows, indent=1))
    print(f"copy bandwidth: {copy:.0f} GB/s\n\n| format | N x K | current | best (BLOCK_N x STEP x warps) |")
    print("|---|---|---|---|")
    for name in args.formats:
        for n, k in TINY_SHAPES if args.tiny else SHAPES:
            mine = [r for r in rows if (r["format"], r["N"], r["K"]) == (name, n, k)]
            now = next(r for r in mine if r["current"]) if any(r["current"] for r in mine) else None
            best = min(mine, key=lambda r: r["us"])
            shape = f"{best['block_n']}x{best['step']}x{best['warps']}"
            now_text = f"{now['fraction_of_copy']:.0%}" if now else "-"
            print(f"| {name} | {n}x{k} | {now_text} | {shape}: {best['fraction_of_copy']:.0%} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()

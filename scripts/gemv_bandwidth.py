"""Decode product bandwidth per weight format: the one-row product y = x @ W^T (or `--rows` rows: a
batched decode step's) through the engine's Triton kernel (TritonLinear, default KernelOptions), as bytes
of the GGUF weight over the time of one product, next to the device's copy bandwidth (a large tensor
copy: bytes read + written over its time).

Weights are random valid blocks (gufo.formats.random_blocks) uploaded by `TritonLinear.prepare`; each
product is timed inside a CUDA graph (as decode runs them) cycling through enough copies of the weight
that the L2 cache holds none of them (median of triton.testing.do_bench_cudagraph). Prints a JSON list of
rows {format, N, K, path, us, gbps, copy_gbps, fraction_of_copy} and a markdown table (path: the
product's activations, int8 or float32); --json also writes the rows.

--sweep times the one-row int8 product's candidate launches instead (gufo.kernels.triton.decode_candidates,
today's launch.INT8_SHAPES entry first) on the same shapes, each checked against the float64 product of
the int8-rounded activations and the dequantized weight (within 1e-4 x |x| @ |W|^T, the GPU tests'
bound) and compared bit for bit with today's result; prints JSON {copy_gbps, rows: one per candidate,
best: per format and shape, recommend: per format the INT8_SHAPES entry (tall: N > K; wide: the other
shapes, best geometric mean)} and a markdown table; --json also writes it (and the rows so far after
each shape, should the run be cut off).

    python scripts/gemv_bandwidth.py --json out.json            # a GPU, about a minute
    python scripts/gemv_bandwidth.py --sweep --json sweep.json  # a GPU: the launch candidates
    python scripts/gemv_bandwidth.py --device cpu --tiny         # smoke check: the Triton interpreter
"""

from __future__ import annotations

import argparse
import dataclasses
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
SWEEP_BOUND = 1e-4  # x |x| @ |W|^T: tests/kernels/test_triton_gemv.py's GPU_REL of float32 products
TINY_SHAPES = [(8, 512)]
L2_BYTES = 60 * 2**20  # H200: 50 MiB; each timed pass reads several times this
COPY_BYTES = 2**30  # the copy bandwidth's tensor


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--formats",
        nargs="+",
        help=f"GGUF types (default {' '.join(FORMATS)}; with --sweep decode_candidates.SWEEP_FORMATS)",
    )
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the Triton interpreter"
    )
    parser.add_argument(
        "--rows", type=int, default=1, help="activation rows per product, 1..16 (default 1: decode's)"
    )
    parser.add_argument("--tiny", action="store_true", help=f"tiny shapes {TINY_SHAPES} (smoke check)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--sweep", action="store_true", help="time the int8 decode launch candidates")
    parser.add_argument("--rep-ms", type=int, default=20, help="with --sweep: ms of replays per timing")
    return parser.parse_args()


def use_device(device: str) -> None:
    """On "cpu", the Triton interpreter: set before Triton is first imported (it picks the interpreter at
    decoration), with the test suite's loop-bound fix (Triton 3.6 on numpy 2.4) and its language patch
    made once per launch."""
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kernels"))
        from triton_interpreter import fix_interpreter_loop_bounds, patch_language_once_per_launch

        fix_interpreter_loop_bounds()
        patch_language_once_per_launch()


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


def config_label(config: Any) -> str:
    """BLOCK_N x STEP/warps, the split if fixed, the decoding switches on: e.g. 8x1024/w4/qs_words."""
    label = f"{config.block_n}x{config.step}/w{config.num_warps}"
    if config.splits is not None:
        label += f"/split{config.splits}"
    on = [f.name for f in dataclasses.fields(config.decoding) if getattr(config.decoding, f.name)]
    return "/".join([label, *on])


def oracle(x: Any, weight: Any) -> tuple[Any, Any]:
    """The exact product (float64) of the int8-rounded activations and the dequantized weight (the
    dequantizers are bit for bit gguf's: tests/kernels/test_triton_gemv.py), and the bound on a
    candidate's error: SWEEP_BOUND x |x| @ |W|^T."""
    import torch

    from gufo.kernels.int8_rows import rounded_rows_reference
    from gufo.kernels.triton.prefill_gemm import dequantize_weight

    w = dequantize_weight(weight, torch.float32).double()
    xr = rounded_rows_reference(x).double()
    return xr @ w.T, SWEEP_BOUND * (xr.abs() @ w.abs().T) + 1e-30


def sweep(qtype_name: str, n: int, k: int, device: str, copy: float, rep_ms: int) -> list[dict[str, Any]]:
    """One row per candidate launch (decode_candidates.candidates) of a one-row [n, k] product."""
    import torch
    from gguf import GGMLQuantizationType

    from gufo.kernels.triton.decode_candidates import candidates
    from gufo.kernels.triton.gemv import TritonLinear
    from gufo.kernels.triton.launch import gemv
    from gufo.options import KernelOptions

    info = random_weight(qtype_name, n, k)
    linear = TritonLinear(KernelOptions())
    copies = copies_for(info.data.nbytes) if device == "cuda" else 1
    weights = [linear.prepare(info, torch.device(device)) for _ in range(copies)]
    x = torch.randn(1, k, device=device, generator=torch.Generator(device).manual_seed(0))
    want, bound = oracle(x, weights[0])
    rows, default = [], None
    for i, config in enumerate(candidates(GGMLQuantizationType[qtype_name], n, k)):

        def product(w: Any, config: Any = config) -> Any:
            return gemv(x, w, 0, linear.launch, config=config)

        row = {"format": qtype_name, "N": n, "K": k, "candidate": i, "default": i == 0}
        row |= {"label": config_label(config), "config": dataclasses.asdict(config)}
        try:
            y = product(weights[0])
            seconds = median_seconds([lambda w=w: product(w) for w in weights], device, rep_ms)
        except Exception as error:  # a candidate the device refuses (e.g. resources): reported, not fatal
            if i == 0:
                raise
            rows.append(row | {"error": repr(error), "gbps": 0.0, "error_vs_bound": math.inf})
            continue
        default = y if default is None else default
        gbps = info.data.nbytes / seconds / 1e9
        rows.append(
            row
            | {
                "us": seconds * 1e6,
                "gbps": gbps,
                "fraction_of_copy": gbps / copy,
                "error_vs_bound": ((y.double() - want).abs() / bound).max().item(),
                "bitwise_default": bool(torch.equal(y, default)),
            }
        )
    return rows


def best_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (format, N, K): the fastest candidate within the bound, with today's fraction beside it."""
    best = []
    for key in dict.fromkeys((r["format"], r["N"], r["K"]) for r in rows):
        mine = [r for r in rows if (r["format"], r["N"], r["K"]) == key]
        good = [r for r in mine if r["error_vs_bound"] <= 1.0]
        top = max(good, key=lambda r: r["gbps"])
        default = next(r for r in mine if r["default"])
        best.append(
            {**top, "default_fraction": default["fraction_of_copy"], "speedup": top["gbps"] / default["gbps"]}
        )
    return best


def recommend(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per format, the INT8_SHAPES entry the sweep picks: (tall: the best candidate on N > K; wide: the
    candidate within the bound on every N <= K shape with the best geometric mean of its bandwidths)."""
    picks = {}
    for name in dict.fromkeys(r["format"] for r in rows):
        mine = [r for r in rows if r["format"] == name and r["error_vs_bound"] <= 1.0]
        entry = {}
        for side, tall in (("tall", True), ("wide", False)):
            side_rows = [r for r in mine if (r["N"] > r["K"]) == tall]
            shapes = {(r["N"], r["K"]) for r in side_rows}
            by_label: dict[str, list[dict[str, Any]]] = {}
            for r in side_rows:
                by_label.setdefault(r["label"], []).append(r)
            complete = {lab: rs for lab, rs in by_label.items() if len(rs) == len(shapes)}
            if not complete:
                continue
            mean = {lab: math.prod(r["gbps"] for r in rs) ** (1 / len(rs)) for lab, rs in complete.items()}
            label = max(mean, key=mean.__getitem__)
            default = next(r for r in side_rows if r["default"])
            entry[side] = {
                "label": label,
                "config": complete[label][0]["config"],
                "fractions": {f"{r['N']}x{r['K']}": r["fraction_of_copy"] for r in complete[label]},
                "speedup_over_default": mean[label] / mean.get(default["label"], float("nan")),
            }
        picks[name] = entry
    return picks


def table(copy: float, columns: list[str], cells: list[tuple[str, ...]]) -> str:
    """A markdown table under the copy bandwidth."""
    lines = [f"copy bandwidth: {copy:.0f} GB/s", "", "| " + " | ".join(columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def sweep_markdown(rows: list[dict[str, Any]], copy: float) -> str:
    columns = ["format", "N x K", "candidate", "us", "GB/s", "of copy", "error / bound", "same bits as today"]
    cells = [
        (r["format"], f"{r['N']}x{r['K']}", r["label"], "failed: " + r["error"], "", "", "", "")
        if "error" in r
        else (
            r["format"],
            f"{r['N']}x{r['K']}",
            r["label"] + (" (today)" if r["default"] else ""),
            f"{r['us']:.2f}",
            f"{r['gbps']:.0f}",
            f"{r['fraction_of_copy']:.0%}",
            f"{r['error_vs_bound']:.2g}",
            "yes" if r["bitwise_default"] else "no",
        )
        for r in rows
    ]
    return table(copy, columns, cells)


def markdown(rows: list[dict[str, Any]], copy: float) -> str:
    columns = ["format", "N x K", "path", "us", "GB/s", "of copy"]
    cells = [
        (
            r["format"],
            f"{r['N']}x{r['K']}",
            r["path"],
            f"{r['us']:.2f}",
            f"{r['gbps']:.0f}",
            f"{r['fraction_of_copy']:.0%}",
        )
        for r in rows
    ]
    return table(copy, columns, cells)


def report(doc: Any, markdown_table: str, path: str | None) -> None:
    """The JSON, then the table; the JSON also to `path` when given."""
    print(json.dumps(doc, indent=1))
    print(markdown_table)
    if path:
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def main() -> None:
    args = parse_args()
    use_device(args.device)
    copy = copy_gbps(args.device, 2**24 if args.tiny else COPY_BYTES)
    shapes = TINY_SHAPES if args.tiny else SHAPES
    if args.sweep:
        from gufo.kernels.triton.decode_candidates import SWEEP_FORMATS  # after use_device: imports Triton

        found: list[dict[str, Any]] = []
        for name in args.formats or [q.name for q in SWEEP_FORMATS]:
            for n, k in shapes:
                found += sweep(name, n, k, args.device, copy, args.rep_ms)
                if args.json:  # the rows so far, should the run be cut off
                    Path(args.json).write_text(
                        json.dumps({"copy_gbps": copy, "rows": found}, indent=1) + "\n"
                    )
        doc = {"copy_gbps": copy, "rows": found, "best": best_rows(found), "recommend": recommend(found)}
        report(doc, sweep_markdown(found, copy), args.json)
        return
    rows = [
        bench(name, n, k, args.device, copy, args.rows) for name in args.formats or FORMATS for n, k in shapes
    ]
    report(rows, markdown(rows, copy), args.json)


if __name__ == "__main__":
    main()

"""Effective bandwidth of the Triton skinny products (bytes of the packed weight over kernel time).

Times `TritonLinear.apply` on random valid weights of Qwen3-8B shapes for each format and M, plus
torch's bf16 matmul of the same shape, inside CUDA graphs (as decode runs them) cycling through
enough weight copies that the L2 holds none of them. Prints a markdown table and, with --json, writes
the rows. Needs a GPU:

    python scripts/gemv_bandwidth.py --formats Q4_K Q6_K Q8_0 --m 1 16
    python scripts/gemv_bandwidth.py --module old_gemv.py  # another version of gemv.py, same API
    python scripts/gemv_bandwidth.py --formats Q4_K Q6_K Q8_0 --int8-vs-float 640x1024 1024x2048
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import triton
from gguf import GGMLQuantizationType

from gufo.formats import block_shape

Q = GGMLQuantizationType
SHAPES = {  # (N, K) of Qwen3-8B's matrices
    "qkv": (4096 + 1024 + 1024, 4096),
    "attn_out": (4096, 4096),
    "gate_up": (2 * 12288, 4096),
    "down": (4096, 12288),
    "output": (151936, 4096),
}
HALF_OFFSETS = {
    Q.Q4_0: (0,),
    Q.Q4_1: (0, 2),
    Q.Q5_0: (0,),
    Q.Q8_0: (0,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
}
FLOAT_DTYPES = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
L2_BYTES = 60 * 2**20  # H200: 50 MiB; weights cycled through several times this


def load_module(path: str | None) -> ModuleType:
    if path is None:
        from gufo.kernels.triton import gemv

        return gemv
    spec = importlib.util.spec_from_file_location("gemv_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def random_rows(qtype: GGMLQuantizationType, n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """GGUF rows uint8 [n, row bytes] on the GPU: random bytes, fp16 scales small and finite."""
    if qtype in FLOAT_DTYPES:
        values = torch.randn(n, k, device="cuda", generator=gen).to(FLOAT_DTYPES[qtype])
        return values.view(torch.uint8)
    elems, size = block_shape(qtype)
    blocks = torch.randint(0, 256, (n, k // elems, size), dtype=torch.uint8, device="cuda", generator=gen)
    for offset in HALF_OFFSETS[qtype]:
        halves = (torch.rand(n, k // elems, device="cuda", generator=gen) - 0.5) * 0.02
        blocks[:, :, offset : offset + 2] = halves.half().view(torch.uint8).reshape(n, k // elems, 2)
    return blocks.reshape(n, -1)


def per_call_ms(calls: list[Callable[[], Any]]) -> float:
    """Median time of one call, replaying a CUDA graph of all of them (each on other weights)."""

    def run_all() -> None:
        for call in calls:
            call()

    run_all()  # compile before capture
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(run_all, rep=30, return_mode="median") / len(calls)


def copies_for(nbytes: int, most: int = 16) -> int:
    return max(1, min(most, math.ceil(3 * L2_BYTES / nbytes)))


def weight_copies(
    mod: ModuleType, qtype: GGMLQuantizationType, n: int, k: int, gen: torch.Generator, most: int = 16
) -> tuple[list[Any], int]:
    """Copies of one random [n, k] weight, enough (up to `most`) that the L2 holds none of them when
    they are read in turn, and the bytes of one."""
    raw = random_rows(qtype, n, k, gen)
    weights = [mod.TritonWeight(qtype, (n, k), mod.split_fields(qtype, raw))]
    nbytes = sum(p.numel() * p.element_size() for p in weights[0].planes)
    weights += [
        dataclasses.replace(weights[0], planes=tuple(p.clone() for p in weights[0].planes))
        for _ in range(copies_for(nbytes, most) - 1)
    ]
    return weights, nbytes


def bench_format(
    mod: ModuleType, qtype: GGMLQuantizationType, shape: str, ms: list[int], dtype: torch.dtype
) -> list[dict[str, Any]]:
    n, k = SHAPES[shape]
    gen = torch.Generator("cuda").manual_seed(0)
    weights, nbytes = weight_copies(mod, qtype, n, k, gen)
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        t = per_call_ms([lambda w=w, x=x: mod.TritonLinear.apply(x, w) for w in weights])
        rows.append(
            {
                "format": qtype.name,
                "shape": shape,
                "N": n,
                "K": k,
                "M": m,
                "us": t * 1e3,
                "GB/s": nbytes / t / 1e6,
            }
        )
    return rows


def int8_vs_float(mod: ModuleType, qtype: GGMLQuantizationType, n: int, k: int) -> list[dict[str, Any]]:
    """One-row products of an [n, k] weight on int8 rows quantized beforehand (as the fused norms hand
    them to decode) and on float32 activations (the vector kernels), whatever gemv.INT8_MIN_WEIGHTS
    would choose for the shape; small weights get enough copies to stay out of the L2 too."""
    from gufo.kernels.triton import gemv_int8

    gen = torch.Generator("cuda").manual_seed(0)
    weights, nbytes = weight_copies(mod, qtype, n, k, gen, most=1024)
    x = torch.randn(1, k, device="cuda", generator=gen)
    quantized = gemv_int8.quantize_rows(x)
    limit = mod.INT8_MIN_WEIGHTS
    times = {}
    try:
        mod.INT8_MIN_WEIGHTS = math.inf
        times["float32"] = per_call_ms([lambda w=w: mod.TritonLinear.apply(x, w) for w in weights])
        times["int8"] = per_call_ms([lambda w=w: mod.TritonLinear.apply(quantized, w) for w in weights])
    finally:
        mod.INT8_MIN_WEIGHTS = limit
    return [
        {
            "format": qtype.name,
            "shape": f"{n}x{k}",
            "M": 1,
            "path": path,
            "us": t * 1e3,
            "GB/s": nbytes / t / 1e6,
        }
        for path, t in times.items()
    ]


def bench_torch(shape: str, ms: list[int]) -> list[dict[str, Any]]:
    n, k = SHAPES[shape]
    w0 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    weights = [w0] + [w0.clone() for _ in range(copies_for(w0.numel() * 2) - 1)]
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t = per_call_ms([lambda w=w, x=x: x @ w.T for w in weights])
        rows.append(
            {
                "format": "torch-bf16",
                "shape": shape,
                "N": n,
                "K": k,
                "M": m,
                "us": t * 1e3,
                "GB/s": n * k * 2 / t / 1e6,
            }
        )
    return rows


def sweep(
    mod: ModuleType,
    qtypes: list[GGMLQuantizationType],
    shapes: list[str],
    configs: list[tuple[int, int, int]],
    dtype: torch.dtype,
) -> list[dict[str, Any]]:
    """M = 1 over vector-kernel launch shapes (block_n, step, num_warps), for the float kernels and the
    int8 ones alike (a module without int8_config has the float kernels only)."""
    rows = []
    chosen = {name: getattr(mod, name) for name in ("vector_config", "int8_config") if hasattr(mod, name)}
    for block_n, step, warps in configs:
        for name in chosen:
            setattr(mod, name, lambda q, n, k, c=(block_n, step, warps): mod.VectorConfig(*c))
        for qtype in qtypes:
            for shape in shapes:
                for row in bench_format(mod, qtype, shape, [1], dtype):
                    rows.append({**row, "config": f"{block_n}x{step}/w{warps}"})
                print(rows[-1], flush=True)
    for name, config in chosen.items():
        setattr(mod, name, config)
    return rows


def _cell(key: str, value: Any) -> str:
    if not isinstance(value, float):
        return str(value)
    return f"{value:.2f}" if key == "us" else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", help="path of another gemv.py to time instead of gufo's")
    parser.add_argument("--formats", nargs="+", default=["Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_K", "BF16"])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--m", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--torch", action="store_true", help="also time torch's bf16 matmul")
    parser.add_argument("--sweep", nargs="*", help="vector configs BLOCK_NxSTEPxWARPS to try at M = 1")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="activation dtype (default float32, what decode multiplies)",
    )
    parser.add_argument(
        "--int8-vs-float",
        nargs="+",
        metavar="NxK",
        help="instead: one-row products of these weight shapes on int8 rows and on float32 activations",
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    mod = load_module(args.module)
    dtype = getattr(torch, args.dtype)
    qtypes = [Q[name] for name in args.formats]
    rows: list[dict[str, Any]] = []
    if args.int8_vs_float:
        for qtype in qtypes:
            for size in args.int8_vs_float:
                n, k = (int(v) for v in size.split("x"))
                rows += int8_vs_float(mod, qtype, n, k)
    elif args.sweep:
        configs = [tuple(int(v) for v in c.split("x")) for c in args.sweep]
        rows += sweep(mod, qtypes, args.shapes, configs, dtype)  # type: ignore[arg-type]
    else:
        for qtype in qtypes:
            for shape in args.shapes:
                rows += bench_format(mod, qtype, shape, args.m, dtype)
        if args.torch:
            for shape in args.shapes:
                rows += bench_torch(shape, args.m)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    keys = [key for key in rows[0] if key not in ("N", "K")]
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(_cell(key, row[key]) for key in keys) + " |")


if __name__ == "__main__":
    main()

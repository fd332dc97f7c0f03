"""Decode products of M int8 activation rows: the vector route (gemv_int8) against the tensor route
(rows_int8, KernelOptions.row_products = "tensor"), per format and weight shape, and a check that the
tensor route is batch-invariant on the device.

For Q4_K, Q6_K and Q8_0 weights of random valid blocks (gemv_bandwidth.random_weight) on Qwen3-8B's
shapes (N x K: attention output 4096x4096, gate/up 12288x4096, down 4096x12288, the output head
151936x4096), each product of M = 1, 2, 4, 8, 16, 32, 48, 64 rows already quantized (`Int8Rows`, as the
fused norms hand them) is timed inside a CUDA graph cycling through enough weight copies that the L2
holds none (gemv_bandwidth.median_seconds): microseconds per product and GB/s of weight bytes, on the
vector route and on the tensor route in each tiling of `--tilings`: "auto" (one tile of 16, 32 or 64
rows by M: launch.tensor_block_m) and "16" (fixed tiles of 16 rows repeated along M, as before issue
23's change: launch.TENSOR_BLOCK_M = (16,), set here only). Then, per format, shape and tiling, 64 rows
in products of CHECK_ROWS rows must be bit for bit alike, and (4096x4096) within the int8 products'
bound of a float64 oracle (the `gguf` package's dequantized weights times the rows' int8 values):
PASS/FAIL lines, exit 1 on a FAIL.

    python scripts/rows_products_bench.py --json rows_products.json      # an H200: a few minutes
    python scripts/rows_products_bench.py --formats Q4_K Q6_K --shapes 4096x4096 12288x4096 4096x12288 \
        --rows 1 16 32 48 64 --tilings auto 16 --json tilings.json        # 64-row tiles against 16-row
    python scripts/rows_products_bench.py --sweep --json tiles.json       # tensor tiles (BLOCK_N, warps)
    python scripts/rows_products_bench.py --device cpu --tiny             # smoke check: the interpreter

--sweep times the tensor route alone on the three layer shapes for each tile height (BLOCK_M) at the
rows of SWEEP_ROWS, for each (BLOCK_N, num_warps) of SWEEP_TILES (all compiled without scratch for
sm_90: `gufo kernels own`) and each split of K of SWEEP_SPLITS, to pick launch.TENSOR_TILES (one BLOCK_N
per format for all heights: see there) and whether the route wants more K splits than launch._splits
gives (its tiles are 8 to 16 times wider than the vector kernels').
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from gemv_bandwidth import COPY_BYTES, copies_for, copy_gbps, median_seconds, random_weight, use_device

FORMATS = ["Q4_K", "Q6_K", "Q8_0"]
SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288), (151936, 4096)]  # (N, K)
TINY_SHAPES = [(72, 512)]
ROWS = [1, 2, 4, 8, 16, 32, 48, 64]
TINY_ROWS = [1, 16, 33]
CHECK_ROWS = (1, 5, 16, 17, 33, 48, 64)  # rows per product whose results must equal each row alone
TINY_CHECK_ROWS = (1, 5, 16, 17, 33)
TILINGS = ["auto", "16"]  # the tensor route's tile heights: launch.TENSOR_BLOCK_M, or 16 rows alone
# (BLOCK_N, num_warps) of rows_int8 by BLOCK_M with no stack frame for sm_90 (Triton 3.6, all three
# formats), and the rows timed on each height
SWEEP_TILES = {
    16: [(32, 4), (64, 4), (64, 8), (128, 4)],
    32: [(32, 4), (32, 8), (64, 8), (128, 8)],
    64: [(32, 8), (32, 16), (64, 8), (64, 16)],
}
SWEEP_ROWS = {16: [1, 16], 32: [32], 64: [64]}
SWEEP_SPLITS = [None, 4, 8, 16]  # K ranges (None: launch._splits' about two programs per multiprocessor)
REP_MS = 10  # per timing: ~10 replays of this long (gemv_bandwidth's 50 would take 5 minutes here)
ORACLE_REL = 1e-4  # tests/kernels/test_triton_rows_int8.py's GPU bound, relative to |x| @ |W|^T


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=FORMATS, help=f"default {' '.join(FORMATS)}")
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=shape,
        help=f"N x K weights (default {' '.join(f'{n}x{k}' for n, k in SHAPES)})",
    )
    parser.add_argument("--rows", nargs="+", type=int, help=f"rows per product timed (default {ROWS})")
    parser.add_argument(
        "--tilings", nargs="+", choices=TILINGS, default=["auto"], help="tensor tilings timed (default auto)"
    )
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the interpreter")
    parser.add_argument("--tiny", action="store_true", help=f"tiny shapes {TINY_SHAPES} (smoke check)")
    parser.add_argument("--sweep", action="store_true", help="time the tensor route's tiles instead")
    parser.add_argument("--json", help="also write the rows and checks to this file")
    return parser.parse_args()


def shape(text: str) -> tuple[int, int]:
    """An N x K weight shape written NxK."""
    n, k = text.lower().split("x")
    return int(n), int(k)


@contextlib.contextmanager
def tiling(name: str) -> Iterator[None]:
    """The tensor route's tile heights while timing or checking: the launch's own ("auto"), or fixed
    tiles of 16 rows repeated along M ("16": what the route ran before it took one tile of up to 64)."""
    from gufo.kernels.triton import launch

    with mock.patch.object(launch, "TENSOR_BLOCK_M", (16,)) if name == "16" else contextlib.nullcontext():
        yield


def route(tensor: bool, tiles: str) -> str:
    return ("tensor" if tiles == "auto" else f"tensor_m{tiles}") if tensor else "vector"


class Setup:
    """One weight (its copies on the device) and the launch settings both routes take."""

    def __init__(self, qtype_name: str, n: int, k: int, device: str) -> None:
        import torch

        from gufo.kernels.triton.dependent_launch import DependentLaunch
        from gufo.kernels.triton.planes import upload

        self.info = random_weight(qtype_name, n, k)
        copies = copies_for(self.info.data.nbytes) if device == "cuda" else 1
        self.weights = [upload(self.info, torch.device(device)) for _ in range(copies)]
        self.launch = DependentLaunch(enabled=True)  # as the engine runs them
        self.device = device

    def rows(self, m: int) -> Any:
        """m rows of activations, quantized to `Int8Rows`."""
        import torch

        from gufo.kernels.triton.gemv_int8 import quantize_rows

        k = self.info.shape[1]
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(self.device)
        return quantize_rows(x, self.launch)

    def product(self, rows: Any, tensor: bool, weight: Any = None, splits: int | None = None) -> Any:
        from gufo.kernels.triton.launch import gemv

        return gemv(rows, weight or self.weights[0], 0, self.launch, splits, tensor_rows=tensor)

    def time(self, m: int, tensor: bool, splits: int | None = None, tiles: str = "auto") -> dict[str, Any]:
        rows = self.rows(m)
        calls = [lambda w=w: self.product(rows, tensor, w, splits) for w in self.weights]
        with tiling(tiles):
            seconds = median_seconds(calls, self.device, REP_MS)
        n, k = self.info.shape
        nbytes = self.info.data.nbytes
        return {"format": self.info.qtype.name, "N": n, "K": k, "M": m, "route": route(tensor, tiles),
                "us": seconds * 1e6, "gbps": nbytes / seconds / 1e9}  # fmt: skip

    def check(self, oracle: bool, counts: tuple[int, ...], tiles: str = "auto") -> list[dict[str, Any]]:
        """Rows of max(counts) in products of `counts` rows against each row alone (bit for bit), and
        the float64 oracle if asked, in tiling `tiles` (the one-row products' tiles are 16 rows in both)."""
        import torch

        m = max(counts)
        x = self.rows(m)
        n, k = self.info.shape
        label = {"format": self.info.qtype.name, "N": n, "K": k, "tiling": tiles}
        results = []
        with tiling(tiles):
            alone = torch.cat([self.product(type(x)(*(t[i : i + 1] for t in x)), True) for i in range(m)])
            for per in counts:
                parts = [self.product(type(x)(*(t[i : i + per] for t in x)), True) for i in range(0, m, per)]
                same = bool(torch.equal(torch.cat(parts), alone))
                results.append(label | {"check": f"rows_alike_m{per}", "pass": same})
        if oracle:
            results.append(label | {"check": "oracle", "pass": self.near_oracle(x, alone)})
        return results

    def near_oracle(self, x: Any, y: Any) -> bool:
        import gguf
        import numpy as np
        import torch

        w = torch.from_numpy(gguf.quants.dequantize(self.info.data, self.info.qtype).astype(np.float64))
        q, scales, _ = (t.cpu() for t in x)
        xd = q.double() * scales.double().repeat_interleave(32, -1)
        bound = ORACLE_REL * (xd.abs() @ w.abs().T) + 1e-30
        return bool(((y.cpu().double() - xd @ w.T).abs() <= bound).all())


def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    from gufo.kernels.triton import launch

    results = []
    for name in args.formats:
        for n, k in TINY_SHAPES if args.tiny else args.shapes or SHAPES[:3]:
            setup = Setup(name, n, k, args.device)
            for height, tiles in SWEEP_TILES.items():
                for block_n, warps in tiles:
                    # rows of SWEEP_ROWS[height] take tiles of that height (launch.tensor_block_m)
                    tile = {setup.info.qtype: (block_n, {height: warps})}
                    with mock.patch.dict(launch.TENSOR_TILES, tile):
                        for m in SWEEP_ROWS[height]:
                            for splits in SWEEP_SPLITS:
                                row = setup.time(m, True, splits)
                                row |= {"block_m": height, "block_n": block_n, "num_warps": warps,
                                        "splits": splits or "auto"}  # fmt: skip
                                print(json.dumps(row), flush=True)
                                results.append(row)
    return results


def main() -> int:
    args = parse_args()
    use_device(args.device)
    if args.sweep:
        rows, checks = sweep(args), []
    else:
        rows, checks = [], []
        counts = TINY_CHECK_ROWS if args.tiny else CHECK_ROWS
        for name in args.formats:
            for n, k in TINY_SHAPES if args.tiny else args.shapes or SHAPES:
                setup = Setup(name, n, k, args.device)
                for m in args.rows or (TINY_ROWS if args.tiny else ROWS):
                    rows.append(setup.time(m, False))
                    print(json.dumps(rows[-1]), flush=True)
                    for tiles in args.tilings:
                        rows.append(setup.time(m, True, tiles=tiles))
                        print(json.dumps(rows[-1]), flush=True)
                for tiles in args.tilings:
                    oracle = (n, k) in (SHAPES[0], TINY_SHAPES[0])
                    checks += setup.check(oracle, counts, tiles)
                del setup  # the head's copies before the next format's
    copy = copy_gbps(args.device, 2**24 if args.tiny else COPY_BYTES)
    for c in checks:
        where = f"{c['format']} {c['N']}x{c['K']} tiling {c['tiling']}"
        print(f"{'PASS' if c['pass'] else 'FAIL'} {where} {c['check']}")
    print(f"copy bandwidth: {copy:.0f} GB/s")
    if not args.sweep:
        print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_gbps": copy, "rows": rows, "checks": checks}, indent=1))
    return 0 if all(c["pass"] for c in checks) else 1


def table(rows: list[dict[str, Any]]) -> str:
    """us per product of each route (vector, then the tensor tilings), one line per format and shape,
    one column per M."""
    ms = sorted({r["M"] for r in rows})
    routes = list(dict.fromkeys(r["route"] for r in rows))
    lines = ["| format | N x K | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|---|" + "---|" * len(ms)]
    by = {(r["format"], r["N"], r["K"], r["M"], r["route"]): r["us"] for r in rows}
    for fmt, n, k in dict.fromkeys((r["format"], r["N"], r["K"]) for r in rows):
        cells = [" / ".join(f"{by[fmt, n, k, m, r]:.1f}" for r in routes) for m in ms]
        lines.append(f"| {fmt} | {n}x{k} | " + " | ".join(cells) + " |")
    return f"us per product, {' / '.join(routes)}:\n" + "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

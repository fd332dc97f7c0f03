"""Decode products of M int8 activation rows: the vector route (gemv_int8) against the tensor route
(rows_int8, KernelOptions.row_products = "tensor"), per format and weight shape, and a check that the
tensor route is batch-invariant on the device.

For Q4_K, Q6_K and Q8_0 weights of random valid blocks (gemv_bandwidth.random_weight) on Qwen3-8B's
shapes (N x K: attention output 4096x4096, gate/up 12288x4096, down 4096x12288, the output head
151936x4096), each product of M = 1, 2, 4, 8, 16, 32, 64 rows already quantized (`Int8Rows`, as the fused
norms hand them) is timed inside a CUDA graph cycling through enough weight copies that the L2 holds
none (gemv_bandwidth.median_seconds): microseconds per product and GB/s of weight bytes. Then, per
format and shape, 64 rows in products of 1, 5, 16 and 64 rows must be bit for bit alike, and
(4096x4096) within the int8 products' bound of a float64 oracle (the `gguf` package's dequantized
weights times the rows' int8 values): PASS/FAIL lines, exit 1 on a FAIL.

    python scripts/rows_products_bench.py --json rows_products.json      # an H200: about 2 minutes
    python scripts/rows_products_bench.py --sweep --json tiles.json       # tensor tiles (BLOCK_N, warps)
    python scripts/rows_products_bench.py --device cpu --tiny             # smoke check: the interpreter

--sweep times the tensor route alone at M = 1, 16 and 64 on the three layer shapes for each (BLOCK_N,
num_warps) of SWEEP_TILES (all compiled without scratch for sm_90: `gufo kernels own`) and each split
of K of SWEEP_SPLITS (the tile for every row count: TENSOR_TILES and TENSOR_WIDE_TILES), to pick
launch.TENSOR_TILES and TENSOR_WIDE_TILES (and whether the route wants more K splits than
launch._splits gives: its tiles are 8 to 16 times wider than the vector kernels').
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from gemv_bandwidth import COPY_BYTES, copies_for, copy_gbps, median_seconds, random_weight, use_device

FORMATS = ["Q4_K", "Q6_K", "Q8_0"]
SHAPES = [(4096, 4096), (12288, 4096), (4096, 12288), (151936, 4096)]  # (N, K)
TINY_SHAPES = [(72, 512)]
ROWS = [1, 2, 4, 8, 16, 32, 64]
CHECK_ROWS = (1, 5, 16, 64)  # rows per product whose results must equal each row alone
TINY_CHECK_ROWS = (1, 5, 16)
# (BLOCK_N, num_warps) of rows_int8 with no stack frame for sm_90 (Triton 3.6, all three formats)
SWEEP_TILES = [(32, 4), (64, 4), (64, 8), (128, 4)]
SWEEP_ROWS = [1, 16, 64]
SWEEP_SPLITS = [None, 4, 8, 16]  # K ranges (None: launch._splits' about two programs per multiprocessor)
REP_MS = 10  # per timing: ~10 replays of this long (gemv_bandwidth's 50 would take 5 minutes here)
ORACLE_REL = 1e-4  # tests/kernels/test_triton_rows_int8.py's GPU bound, relative to |x| @ |W|^T


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=FORMATS, help=f"default {' '.join(FORMATS)}")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the interpreter")
    parser.add_argument("--tiny", action="store_true", help=f"tiny shapes {TINY_SHAPES} (smoke check)")
    parser.add_argument("--sweep", action="store_true", help="time the tensor route's tiles instead")
    parser.add_argument("--json", help="also write the rows and checks to this file")
    return parser.parse_args()


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

    def time(self, m: int, tensor: bool, splits: int | None = None) -> dict[str, Any]:
        rows = self.rows(m)
        calls = [lambda w=w: self.product(rows, tensor, w, splits) for w in self.weights]
        seconds = median_seconds(calls, self.device, REP_MS)
        n, k = self.info.shape
        nbytes = self.info.data.nbytes
        route = "tensor" if tensor else "vector"
        return {"format": self.info.qtype.name, "N": n, "K": k, "M": m, "route": route,
                "us": seconds * 1e6, "gbps": nbytes / seconds / 1e9}  # fmt: skip

    def check(self, oracle: bool, counts: tuple[int, ...]) -> list[dict[str, Any]]:
        """Rows of max(counts) in products of `counts` rows against each row alone (bit for bit), and
        the float64 oracle if asked."""
        import torch

        m = max(counts)
        x = self.rows(m)
        alone = torch.cat([self.product(type(x)(*(t[i : i + 1] for t in x)), True) for i in range(m)])
        n, k = self.info.shape
        results = []
        for per in counts:
            parts = [self.product(type(x)(*(t[i : i + per] for t in x)), True) for i in range(0, m, per)]
            same = bool(torch.equal(torch.cat(parts), alone))
            results.append({"format": self.info.qtype.name, "N": n, "K": k, "check": f"rows_alike_m{per}",
                            "pass": same})  # fmt: skip
        if oracle:
            results.append({"format": self.info.qtype.name, "N": n, "K": k, "check": "oracle",
                            "pass": self.near_oracle(x, alone)})  # fmt: skip
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
        for n, k in TINY_SHAPES if args.tiny else SHAPES[:3]:
            setup = Setup(name, n, k, args.device)
            for tile in SWEEP_TILES:
                tiles = {setup.info.qtype: tile}
                with (
                    mock.patch.dict(launch.TENSOR_TILES, tiles),
                    mock.patch.dict(launch.TENSOR_WIDE_TILES, tiles),
                ):
                    for m in SWEEP_ROWS:
                        for splits in SWEEP_SPLITS:
                            row = setup.time(m, True, splits)
                            row |= {"block_n": tile[0], "num_warps": tile[1], "splits": splits or "auto"}
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
        for name in args.formats:
            for n, k in TINY_SHAPES if args.tiny else SHAPES:
                setup = Setup(name, n, k, args.device)
                for m in [1, 16] if args.tiny else ROWS:
                    for tensor in (False, True):
                        rows.append(setup.time(m, tensor))
                        print(json.dumps(rows[-1]), flush=True)
                counts = TINY_CHECK_ROWS if args.tiny else CHECK_ROWS
                checks += setup.check(oracle=(n, k) in (SHAPES[0], TINY_SHAPES[0]), counts=counts)
                del setup  # the head's copies before the next format's
    copy = copy_gbps(args.device, 2**24 if args.tiny else COPY_BYTES)
    for c in checks:
        print(f"{'PASS' if c['pass'] else 'FAIL'} {c['format']} {c['N']}x{c['K']} {c['check']}")
    print(f"copy bandwidth: {copy:.0f} GB/s")
    if not args.sweep:
        print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_gbps": copy, "rows": rows, "checks": checks}, indent=1))
    return 0 if all(c["pass"] for c in checks) else 1


def table(rows: list[dict[str, Any]]) -> str:
    """us per product, vector / tensor, one line per format and shape, one column per M."""
    ms = sorted({r["M"] for r in rows})
    lines = ["| format | N x K | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|---|" + "---|" * len(ms)]
    by = {(r["format"], r["N"], r["K"], r["M"], r["route"]): r["us"] for r in rows}
    for fmt, n, k in dict.fromkeys((r["format"], r["N"], r["K"]) for r in rows):
        cells = [f"{by[fmt, n, k, m, 'vector']:.1f} / {by[fmt, n, k, m, 'tensor']:.1f}" for m in ms]
        lines.append(f"| {fmt} | {n}x{k} | " + " | ".join(cells) + " |")
    return "us per product, vector / tensor:\n" + "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

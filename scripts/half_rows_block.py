"""How tall the fixed float16 row product (`rows_half.product`, `--row-products f16`) could be: microseconds
per product of exactly M rows (float16 operands, float32 out, cuBLAS) on Qwen3-8B's shapes for M = 16..512,
each with the weight-read rate it reaches, plus per M whether a row's numbers are the same at every
position of the block and whatever the other rows hold (the fixed shape's invariance; PASS/FAIL).

Why: a step of R rows costs ceil(R / BLOCK_M) such products per weight; a taller block reads the weights
fewer times at 128-256 rows but costs a 1-row step what the tall block costs. The per-layer sum below is
what a decode step of BLOCK_M rows pays in products (2x 4096x4096, 2x 1024x4096, 2x 12288x4096, 1x
4096x12288 per layer; the 151936x4096 output once a step).

    python scripts/half_rows_block.py --json half-rows-block.json    # a GPU, about a minute
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from gemv_bandwidth import copies_for, median_seconds

SHAPES = {(4096, 4096): 2, (1024, 4096): 2, (12288, 4096): 2, (4096, 12288): 1, (151936, 4096): 1 / 36}
BLOCKS = (16, 32, 64, 128, 192, 256, 512)
REP_MS = 20


def invariant(weight: torch.Tensor, m: int) -> bool:
    """Each of 8 rows, put at 8 positions of an M-row block among random others, gives one result."""
    generator = torch.Generator(device="cuda").manual_seed(m)
    probe = torch.randn(8, weight.shape[1], device="cuda", generator=generator).half()
    first = None
    for trial in range(8):
        block = torch.randn(m, weight.shape[1], device="cuda", generator=generator).half() * (trial + 1)
        rows = [(i * 7 + trial * 3) % m for i in range(min(8, m))]
        block[rows] = probe[: len(rows)]
        got = torch.mm(block, weight.T, out_dtype=torch.float32)[rows]
        first = got if first is None else first
        if not torch.equal(got, first[: len(rows)]):
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows, layer_us = [], {m: 0.0 for m in BLOCKS}
    for (n, k), per_layer in SHAPES.items():
        weight = torch.randn(n, k, device="cuda").half()
        weights = [weight] + [weight.clone() for _ in range(copies_for(weight.numel() * 2) - 1)]
        for m in BLOCKS:
            x = torch.randn(m, k, device="cuda").half()
            seconds = median_seconds(
                [lambda w=w, x=x: torch.mm(x, w.T, out_dtype=torch.float32) for w in weights], "cuda", REP_MS
            )
            gbps = weight.numel() * 2 / seconds / 1e9
            same = invariant(weight, m)
            row = {"N": n, "K": k, "M": m, "us": seconds * 1e6, "weight_gbps": gbps, "invariant": same}
            print(json.dumps(row), flush=True)
            rows.append(row)
            layer_us[m] += per_layer * seconds * 1e6
        del weights, weight
    for m, us in layer_us.items():
        print(f"M={m}: {us:.1f} us of products per layer, {36 * us / 1000:.2f} ms per 36-layer step")
    failed = [r for r in rows if not r["invariant"]]
    for r in failed:
        print(f"FAIL {r['N']}x{r['K']} M={r['M']}: a row's numbers moved with its position or its neighbours")
    print("PASS" if not failed else "FAIL")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "layer_us": layer_us}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Time of decode attention (the split and combine kernels) for one layer of Qwen3-8B heads (32 query,
8 KV, 128 wide) over a paged float16 cache: a decode step of T sequences, each in its own slot at the
same depth, replayed in a CUDA graph that cycles through enough caches that the L2 holds none. Sweeps the
sequences per step, programs per multiprocessor, pipeline stages, keys per loop step and the product
form. Needs a GPU:

    python scripts/decode_attention.py --tokens 1 16 64 --depths 16 512 4096
    python scripts/decode_attention.py --depths 16 4096 --programs 2 4 8 --stages 1 2 3
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from gemv_bandwidth import median_seconds

from gufo.kernels.kv_pages import KVPages
from gufo.kernels.triton import attention
from gufo.kernels.triton.dependent_launch import DependentLaunch

HEADS, KV_HEADS, DIM, PAGE = 32, 8, 128, 64
REP_MS = 20


def paged_cache(tokens: int, depth: int) -> KVPages:
    """`tokens` slots of depth + 1 random entries each, in pages of PAGE (page 0 unused: the trash page)."""
    per_slot = depth // PAGE + 1
    pool = [torch.randn(KV_HEADS, tokens * per_slot + 1, PAGE, DIM, device="cuda").half() for _ in range(2)]
    table = torch.arange(1, tokens * per_slot + 1, device="cuda").view(tokens, per_slot)
    return KVPages(*pool, table)


def time_us(tokens: int, depth: int, copies: int) -> float:
    """Microseconds per decode-attention call of `tokens` sequences at `depth` cached entries."""
    kernel = attention.TritonAttentionDecode(DependentLaunch(enabled=True))
    q = torch.randn(tokens, HEADS, DIM, device="cuda")
    index = torch.full((tokens,), depth, device="cuda")
    slots = torch.arange(tokens, device="cuda")
    caches = [paged_cache(tokens, depth) for _ in range(copies)]
    calls = [lambda c=c: kernel.apply(q, c, index, slots, DIM**-0.5, None) for c in caches]
    return median_seconds(calls, "cuda", REP_MS) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1], help="sequences per decode step")
    parser.add_argument("--depths", nargs="+", type=int, default=[16, 4096])
    parser.add_argument("--programs", nargs="+", type=int, default=[attention.PROGRAMS_PER_MULTIPROCESSOR])
    parser.add_argument("--stages", nargs="+", type=int, default=[attention.NUM_STAGES])
    parser.add_argument("--dot-elements", nargs="+", type=int, default=[attention.DOT_ELEMENTS],
                        help="keys x head width per loop step on the tl.dot path")  # fmt: skip
    parser.add_argument("--forms", nargs="+", default=["dot"], choices=["dot", "elementwise"])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    print("| form | programs/SM | stages | dot elements | tokens | depth | us | GB/s |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for form, programs, stages, elements, tokens, depth in itertools.product(
        args.forms, args.programs, args.stages, args.dot_elements, args.tokens, args.depths
    ):
        attention.use_dot = lambda f=form: f == "dot"
        attention.PROGRAMS_PER_MULTIPROCESSOR, attention.NUM_STAGES = programs, stages
        attention.DOT_ELEMENTS = elements
        nbytes = 2 * KV_HEADS * tokens * (depth // PAGE + 1) * PAGE * DIM * 2
        copies = max(1, min(8, (200 << 20) // nbytes))
        us = time_us(tokens, depth, copies)
        gbs = 2 * KV_HEADS * tokens * (depth + 1) * DIM * 2 / us / 1e3
        rows.append({"form": form, "programs": programs, "stages": stages, "dot_elements": elements,
                     "tokens": tokens, "depth": depth, "us": us, "gbs": gbs})  # fmt: skip
        print(f"| {form} | {programs} | {stages} | {elements} | {tokens} | {depth} | {us:.1f} | {gbs:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

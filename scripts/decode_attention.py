"""Time of decode attention (the split and combine kernels) for one layer of Qwen3-8B heads (32 query,
8 KV, 128 wide) over a float16 cache, replayed in a CUDA graph that cycles through enough caches that
the L2 holds none. Sweeps programs per multiprocessor, pipeline stages, keys per loop step and the
product form. Needs a GPU:

    python scripts/decode_attention.py --depths 16 4096 --programs 2 4 8 --stages 1 2 3
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from gufo.kernels.triton import attention

HEADS, KV_HEADS, DIM = 32, 8, 128


def time_us(depth: int, copies: int, calls: int = 20) -> float:
    """Microseconds per decode-attention call at `depth` cached entries."""
    context = depth + 256
    caches = [torch.randn(2, KV_HEADS, context, DIM, device="cuda").half() for _ in range(copies)]
    q = torch.randn(1, HEADS, DIM, device="cuda")
    index = torch.tensor([depth], device="cuda")
    run = [
        lambda c=c: attention.TritonAttentionDecode.apply(q, c[0], c[1], index, DIM**-0.5, None)
        for c in caches
    ]
    for r in run:  # compile, warm up
        r()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            run[i % copies]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", nargs="+", type=int, default=[16, 4096])
    parser.add_argument("--programs", nargs="+", type=int, default=[attention.PROGRAMS_PER_MULTIPROCESSOR])
    parser.add_argument("--stages", nargs="+", type=int, default=[attention.NUM_STAGES])
    parser.add_argument("--dot-elements", nargs="+", type=int, default=[attention.DOT_ELEMENTS],
                        help="keys x head width per loop step on the tl.dot path")  # fmt: skip
    parser.add_argument("--forms", nargs="+", default=["dot", "elementwise"], choices=["dot", "elementwise"])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    print("| form | programs/SM | stages | dot elements | depth | us | GB/s |\n|---|--:|--:|--:|--:|--:|--:|")
    for form, programs, stages, elements, depth in itertools.product(
        args.forms, args.programs, args.stages, args.dot_elements, args.depths
    ):
        attention.use_dot = lambda f=form: f == "dot"
        attention.PROGRAMS_PER_MULTIPROCESSOR, attention.NUM_STAGES = programs, stages
        attention.DOT_ELEMENTS = elements
        copies = max(1, min(8, (200 << 20) // (2 * KV_HEADS * (depth + 256) * DIM * 2)))
        us = time_us(depth, copies)
        gbs = 2 * KV_HEADS * (depth + 1) * DIM * 2 / us / 1e3
        rows.append({"form": form, "programs": programs, "stages": stages, "dot_elements": elements,
                     "depth": depth, "us": us, "gbs": gbs})  # fmt: skip
        print(f"| {form} | {programs} | {stages} | {elements} | {depth} | {us:.1f} | {gbs:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

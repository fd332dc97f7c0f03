"""The routed experts of one MoE layer's prefill: the grouped products (one launch per expert matrix over
every token-expert assignment, experts_prefill.py) against the per-expert route they replace (one
TritonLinear product per expert over its rows, the counts read on the host, index_add_ to combine).

Qwen3.5-35B-A3B's shapes (gufo synth's 35b-a3b preset: hidden 2048, 256 experts of FFN 512, 8 per
token): the gate and up rows [256 x 1024, 2048] in Q4_K, down [256 x 2048, 512] in Q6_K or Q4_K (a
Q4_K_M file's two kinds of layer), random valid blocks (gemv_bandwidth.random_weight), a random router
(softmax of normal logits, top 8, renormalised). Per prefill of 512 and 2048 tokens and per route: the
median milliseconds (triton.testing.do_bench, no CUDA graph: the old route reads the counts on the
host) of gate_up, down and the whole routed section (grouping, gate_up, SwiGLU, down, combine), the
section's tokens per second over 40 such layers, and the largest difference between the routes'
outputs relative to the largest output. Prints JSON; --json also writes it.

    python scripts/moe_grouped_bench.py --json moe_grouped.json       # an H200: about a minute
    python scripts/moe_grouped_bench.py --device cpu --tiny           # smoke check: the interpreter
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from unittest import mock

from gemv_bandwidth import random_weight, use_device

SHAPE = (256, 8, 2048, 512)  # experts, experts per token, hidden, expert FFN (synth's 35b-a3b)
TINY_SHAPE = (4, 2, 256, 256)
TOKENS = [512, 2048]
TINY_TOKENS = [8]
DOWN_FORMATS = ["Q6_K", "Q4_K"]  # a Q4_K_M file's down tensors; gate and up are Q4_K
LAYERS = 40  # the 35B-A3B's MoE layers, for tokens per second of the routed experts alone


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the interpreter")
    parser.add_argument("--tiny", action="store_true", help=f"tiny shape {TINY_SHAPE}, {TINY_TOKENS} tokens")
    parser.add_argument("--json", help="also write the results to this file")
    return parser.parse_args()


def expert_weight(kernel: Any, qtype_name: str, n_experts: int, rows: int, cols: int) -> Any:
    """A 3-D expert tensor of random valid blocks, uploaded as the engine does."""
    from gufo.gguf.model_file import TensorInfo

    flat = random_weight(qtype_name, n_experts * rows, cols)
    data = flat.data.reshape(n_experts, rows, -1)
    return kernel.prepare(TensorInfo("w", flat.qtype, (n_experts, rows, cols), 0, data.nbytes, data))


def milliseconds(call: Callable[[], Any], device: str) -> float:
    if device == "cpu":
        start = time.perf_counter()
        call()
        return (time.perf_counter() - start) * 1e3
    import triton

    return float(triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median"))


def bench(down_format: str, tokens: int, shape: tuple[int, int, int, int], device: str) -> dict[str, Any]:
    import torch

    from gufo.kernels import registry
    from gufo.kernels.catalog import register_all
    from gufo.kernels.contracts import GATED_ACT
    from gufo.kernels.expert_groups import combine, group_assignments, tile_rows
    from gufo.kernels.triton import experts
    from gufo.options import KernelOptions

    n_experts, n_used, hidden, ff = shape
    kernel = experts.TritonExpertLinear(KernelOptions())
    gate_up = expert_weight(kernel, "Q4_K", n_experts, 2 * ff, hidden)
    down = expert_weight(kernel, down_format, n_experts, hidden, ff)
    register_all("cuda")
    activation = registry.lookup("cuda", GATED_ACT)[1]
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).to(device)
    weights, chosen = torch.softmax(torch.randn(tokens, n_experts, generator=gen), -1).topk(n_used, -1)
    weights, chosen = (weights / weights.sum(-1, keepdim=True)).to(device), chosen.to(device)

    def section(old: bool) -> torch.Tensor:
        groups = group_assignments(chosen, n_experts, tile_rows(chosen.numel(), n_experts))
        gate, up = kernel.grouped(x[groups.tokens], gate_up, groups).split([ff, ff], dim=-1)
        y = kernel.grouped(activation.apply(gate.contiguous(), up.contiguous(), "silu"), down, groups)
        if old:  # the replaced combine: weights by sorted row, then a scatter-add per token
            y = y * weights.reshape(-1)[groups.order, None]
            return torch.zeros_like(x).index_add_(0, groups.tokens, y)
        return combine(y, groups, weights)

    groups = group_assignments(chosen, n_experts, tile_rows(chosen.numel(), n_experts))
    rows, hidden_rows = x[groups.tokens], torch.randn(chosen.numel(), ff, device=device)
    routes: dict[str, Any] = {}
    outputs = {}
    for route in ("grouped", "per_expert"):
        old = route == "per_expert"
        # the per-expert route: TritonExpertLinear.grouped as for formats without a grouped kernel
        patch = mock.patch.object(experts, "runs_grouped", lambda qtype: False) if old else nullcontext()
        with patch:
            outputs[route] = section(old)
            routes[route] = {
                "gate_up_ms": milliseconds(lambda: kernel.grouped(rows, gate_up, groups), device),
                "down_ms": milliseconds(lambda: kernel.grouped(hidden_rows, down, groups), device),
                "section_ms": milliseconds(lambda old=old: section(old), device),
            }
        routes[route]["tokens_per_s"] = tokens / (LAYERS * routes[route]["section_ms"] * 1e-3)
    new, old_out = outputs["grouped"], outputs["per_expert"]
    return {
        "down_format": down_format,
        "tokens": tokens,
        "shape": dict(zip(("experts", "per_token", "hidden", "ff"), shape, strict=True)),
        "tile_rows": groups.block_m,
        **routes,
        "speedup": routes["per_expert"]["section_ms"] / routes["grouped"]["section_ms"],
        "max_rel_diff": float((new - old_out).abs().max() / old_out.abs().max().clamp_min(1e-30)),
    }


def main() -> None:
    args = parse_args()
    use_device(args.device)
    # the smoke check: one down format (the interpreter takes minutes per format)
    shape, tokens, formats = (
        (TINY_SHAPE, TINY_TOKENS, DOWN_FORMATS[:1]) if args.tiny else (SHAPE, TOKENS, DOWN_FORMATS)
    )
    rows = [bench(fmt, n, shape, args.device) for fmt in formats for n in tokens]
    text = json.dumps(rows, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()

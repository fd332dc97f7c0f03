"""MoE decode expert products: the expert-indexed products (launch.ExpertRows: the vector kernels read the
chosen experts' rows in place by their device-side ids) against the route they replace, which copied
the chosen experts' rows out of the planes (index_select) and ran the plain product on the copy (for
one row per assignment, every row against every chosen expert, keeping the diagonal blocks).

Shapes of a qwen35moe preset (gufo.tools.synth, default 35b-a3b: hidden 2048, expert FFN 512, 256
experts, top-8): per format, the stacked gate+up product on the token's row (one row for all its
assignments when one token decodes, a row each when several do) and the down product (a row each), for
1..8 tokens (8..64 assignments), each token choosing top-k distinct random experts. Weights are random
valid blocks (gemv_bandwidth.random_weight) through TritonExpertLinear.prepare (default KernelOptions:
int8 activations where one expert's matrix takes them); each route timed in a CUDA graph cycling through
enough expert-id sets that the L2 holds no expert read before (gemv_bandwidth.median_seconds).

Prints a JSON list of rows {format, matrix, rows, cols, tokens, assignments, path, indexed_us, old_us,
speedup, indexed_gbps, old_gbps, bitwise} (GB/s: the distinct chosen experts' bytes over one product's
time; bitwise: the two routes' outputs are equal bit for bit) and a markdown table; --json also writes
the rows.

    python scripts/expert_products_bench.py --json experts.json              # a GPU, about a minute
    python scripts/expert_products_bench.py --device cpu --preset tiny --tokens 1 2 --formats Q8_0
"""

from __future__ import annotations

import argparse
from typing import Any

from gemv_bandwidth import L2_BYTES, median_seconds, random_weight, report, use_device

FORMATS = ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS"]
TOKENS = [1, 2, 4, 8]
NEVER_INT8 = 2**62  # an int8 limit no matrix reaches (the old route's float32 choice)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--formats", nargs="+", default=FORMATS, help=f"GGUF types (default {' '.join(FORMATS)})"
    )
    parser.add_argument(
        "--preset", default="35b-a3b", help="qwen35moe preset of gufo.tools.synth (default 35b-a3b)"
    )
    parser.add_argument("--tokens", nargs="+", type=int, default=TOKENS, help="tokens per decode step")
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the Triton interpreter"
    )
    parser.add_argument("--json", help="also write the rows to this file")
    return parser.parse_args()


def old_route(kernel: Any, x: Any, weight: Any, ids: Any) -> Any:
    """The replaced decode route: the chosen experts' rows copied out, then one plain product."""
    from gufo.kernels.triton.launch import gemv, runs_on_int8

    n, r = ids.shape[0], weight.rows
    picked = weight.experts(lambda plane: plane.index_select(0, ids))
    limit = 0 if runs_on_int8(weight.expert(0), kernel.linear.int8_min_weights) else NEVER_INT8
    y = gemv(x, picked, limit, kernel.linear.launch)  # [x rows, n * r]
    if x.shape[0] == 1:
        return y.reshape(n, r)
    return y.reshape(n, n, r).diagonal(dim1=0, dim2=1).T.contiguous()


def bench(
    qtype_name: str, matrix: str, rows: int, cols: int, n_experts: int, top_k: int, tokens: int, device: str
) -> dict[str, Any]:
    import torch

    from gufo.gguf.model_file import TensorInfo
    from gufo.kernels.triton.experts import TritonExpertLinear
    from gufo.kernels.triton.launch import runs_on_int8
    from gufo.options import KernelOptions

    kernel = TritonExpertLinear(KernelOptions())
    flat = random_weight(qtype_name, n_experts * rows, cols)
    data = flat.data.reshape(n_experts, rows, -1)
    info = TensorInfo(flat.name, flat.qtype, (n_experts, rows, cols), 0, data.nbytes, data)
    weight = kernel.prepare(info, torch.device(device))
    expert_bytes = info.n_bytes // n_experts
    gen = torch.Generator().manual_seed(tokens)
    assignments = tokens * top_k
    read = assignments * expert_bytes
    sets = max(2, min(64, 3 * L2_BYTES // read + 1)) if device == "cuda" else 1
    id_sets = [
        torch.stack([torch.randperm(n_experts, generator=gen)[:top_k] for _ in range(tokens)]).reshape(-1)
        for _ in range(sets)
    ]
    x_rows = 1 if matrix == "gate_up" and tokens == 1 else assignments
    x = torch.randn(x_rows, cols, generator=gen).to(device)
    ids = [i.to(device) for i in id_sets]
    indexed = median_seconds([lambda i=i: kernel.gathered(x, weight, i) for i in ids], device)
    old = median_seconds([lambda i=i: old_route(kernel, x, weight, i) for i in ids], device)
    bitwise = all(torch.equal(kernel.gathered(x, weight, i), old_route(kernel, x, weight, i)) for i in ids)
    distinct = sum(len(set(i.tolist())) for i in id_sets) / len(id_sets) * expert_bytes
    int8 = runs_on_int8(weight.expert(0), kernel.linear.int8_min_weights)
    return {
        "format": qtype_name,
        "matrix": matrix,
        "rows": rows,
        "cols": cols,
        "tokens": tokens,
        "assignments": assignments,
        "path": "int8" if int8 else "float32",
        "indexed_us": indexed * 1e6,
        "old_us": old * 1e6,
        "speedup": old / indexed,
        "indexed_gbps": distinct / indexed / 1e9,
        "old_gbps": distinct / old / 1e9,
        "bitwise": bitwise,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| format | matrix | tokens | path | indexed us | old us | speedup | indexed GB/s | bitwise |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = (
            r["format"],
            f"{r['matrix']} {r['rows']}x{r['cols']}",
            str(r["tokens"]),
            r["path"],
            f"{r['indexed_us']:.2f}",
            f"{r['old_us']:.2f}",
            f"{r['speedup']:.2f}",
            f"{r['indexed_gbps']:.0f}",
            str(r["bitwise"]),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    use_device(args.device)
    from gufo.tools.synth.presets import QWEN35MOE_PRESETS

    shape = QWEN35MOE_PRESETS[args.preset]
    hidden, ff = shape.hidden_size, shape.moe_intermediate_size
    matrices = (("gate_up", 2 * ff, hidden), ("down", hidden, ff))
    rows = [
        bench(name, matrix, n, k, shape.num_experts, shape.num_experts_per_tok, tokens, args.device)
        for name in args.formats
        for matrix, n, k in matrices
        for tokens in args.tokens
    ]
    report(rows, markdown(rows), args.json)


if __name__ == "__main__":
    main()

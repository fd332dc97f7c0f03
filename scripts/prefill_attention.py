"""Time of prefill attention for one layer of Qwen3-8B heads (32 query, 8 KV, 128 wide) over a float16
cache, as the prefill graphs call it (`attend_cached`: a chunk's queries over its slot's entries up to
its end): gufo's fixed tiles (`attention_prefill`, chunk-invariant) against torch's flash kernel (the
cuBLAS route's), for chunks of T tokens after `depth` cached entries, replayed in a CUDA graph; and
whether each tile launch's rows equal the same rows attended in two chunks (bit for bit). One JSON
object per (kernel, T, depth) on stdout. For a GPU (`--device cpu` with TRITON_INTERPRET=1 checks the
script itself on small chunks):

    python scripts/prefill_attention.py --tokens 128 512 2048 --depths 0 4096
"""

from __future__ import annotations

import argparse
import json

import torch
from gemv_bandwidth import median_seconds

from gufo.kernels.attention import FusedAttentionPrefill
from gufo.kernels.triton.attention_prefill import TritonAttentionPrefill

HEADS, KV_HEADS, DIM = 32, 8, 128
REP_MS = 20
KERNELS = {"tiles": TritonAttentionPrefill.apply, "flash": FusedAttentionPrefill.apply}


def operands(tokens: int, depth: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk's queries [T, H, D] (float32, as the graphs hold them) and its slot's entries up to its
    end, keys and values [Hkv, depth + T, D] (float16)."""
    q = torch.randn(tokens, HEADS, DIM, device=device)
    keys, values = (torch.randn(KV_HEADS, depth + tokens, DIM, device=device).half() for _ in range(2))
    return q, keys, values


def chunks_equal(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, whole: torch.Tensor) -> bool:
    """Whether the chunk attended as two chunks (cut in its middle, off any tile edge) gives the whole
    launch's rows bit for bit."""
    tokens, end = q.shape[0], keys.shape[1]
    cut = tokens // 2 + 3 if tokens > 8 else tokens // 2
    head = end - tokens + cut  # the first chunk's end
    first = TritonAttentionPrefill.apply(q[:cut], keys[:, :head], values[:, :head], 0, DIM**-0.5, None)
    second = TritonAttentionPrefill.apply(q[cut:], keys, values, 0, DIM**-0.5, None)
    return bool(torch.equal(torch.cat([first, second]), whole))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 512, 2048], help="tokens per chunk")
    parser.add_argument("--depths", nargs="+", type=int, default=[0, 4096], help="entries cached before it")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu under TRITON_INTERPRET=1")
    args = parser.parse_args()
    for depth in args.depths:
        for tokens in args.tokens:
            q, keys, values = operands(tokens, depth, args.device)
            outputs = {}
            for name, kernel in KERNELS.items():
                outputs[name] = kernel(q, keys, values, 0, DIM**-0.5, None)
                args_of_call = (q, keys, values, 0, DIM**-0.5, None)
                seconds = median_seconds([lambda k=kernel, a=args_of_call: k(*a)], args.device, REP_MS)
                # causal: each query sees its own entry and those before it
                pairs = tokens * depth + tokens * (tokens + 1) / 2
                record = {"kernel": name, "tokens": tokens, "depth": depth, "us": round(seconds * 1e6, 1)}
                record["tflops"] = round(4 * HEADS * DIM * pairs / seconds / 1e12, 1)
                print(json.dumps(record), flush=True)
            diff = float((outputs["tiles"] - outputs["flash"]).abs().max())
            equal = chunks_equal(q, keys, values, outputs["tiles"])
            print(json.dumps({"tokens": tokens, "depth": depth, "max_abs_diff": diff, "chunks_equal": equal}))


if __name__ == "__main__":
    main()

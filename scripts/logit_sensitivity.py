"""How far a model's final logits move between runs that differ only in float32 summation order.

The `--validate-prefill` tokens (gufo.tools.quality.validate_prefill) go through the model as decode steps
(replayed from CUDA graphs on a GPU), as eager decode steps, and as batched prefill in chunks of 512,
128 and 64 tokens; each run's final logits are compared with the first's. Differences far beyond
float32 rounding mean some step of the forward pass is discontinuous (int8 activation rounding, where a
float32 change flips a rounding); they bound the top-1 lead that `--validate-prefill` can expect to see
kept. On a GPU (or `--device cpu`):

    python scripts/logit_sensitivity.py -m gemma3-270m -n 256
    GUFO_INT8_MIN_WEIGHTS=0 python scripts/logit_sensitivity.py -m gemma3-270m -n 256  # int8 everywhere
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from gufo.engine.engine import Engine
from gufo.options import RunOptions
from gufo.tools.quality.validate_prefill import decode_sequentially, validation_tokens


def final_logits(
    model: str,
    n_tokens: int,
    device: str,
    use: Callable[[Engine, list[int]], torch.Tensor],
    graphs: bool = True,
    **options,
) -> torch.Tensor:
    engine = Engine(model, RunOptions(device=device, graphs=graphs), **options)
    with torch.inference_mode():
        logits = use(engine, validation_tokens(engine, n_tokens)).float()
    del engine
    torch.cuda.empty_cache()
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", default="gemma3-270m", help="GGUF file path or alias")
    parser.add_argument("-n", "--tokens", type=int, default=256, help="validation tokens (default 256)")
    parser.add_argument("--device", default="cuda", help="GPU to run on (default cuda)")
    args = parser.parse_args()
    prefill = lambda engine, tokens: engine.prefill(tokens)  # noqa: E731
    runs = {
        "decode": (decode_sequentially, {}),
        "decode, no CUDA graphs": (decode_sequentially, {"graphs": False}),
    }
    runs |= {f"prefill, chunks of {b}": (prefill, {"batch_size": b}) for b in (512, 128, 64)}
    results = {
        label: final_logits(args.model, args.tokens, args.device, use, **options)
        for label, (use, options) in runs.items()
    }
    first = next(iter(results.values()))
    top, runner_up = first.topk(2).indices.tolist()
    print(f"{args.tokens} tokens; first run's top-2: {top}, {runner_up}\n")
    print(f"| run | top-1 | its lead | logit {top} - logit {runner_up} | max diff | mean diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, logits in results.items():
        best = logits.topk(2)
        diff = (logits - first).abs()
        print(
            f"| {label} | {best.indices[0].item()} | {(best.values[0] - best.values[1]).item():.4f} "
            f"| {(logits[top] - logits[runner_up]).item():+.4f} | {diff.max().item():.4f} "
            f"| {diff.mean().item():.4f} |"
        )


if __name__ == "__main__":
    main()

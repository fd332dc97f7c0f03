"""Where the GPU time of a prefill and of a decode step goes: torch profiler tables per kernel.

Runs one prefill of --prompt random tokens (after --depth tokens of context), then --steps eager decode
steps (op by op, so every kernel shows; graphs replay the same kernels), and prints the kernels by
total GPU time with their launch counts. Then it times the same steps replayed from a captured CUDA
graph: the step time minus the kernels' busy time is what launching and draining the kernels costs
inside the graph. Needs a GPU:

    python scripts/profile_step.py -m qwen3-8b.gguf --prompt 2048 --depth 0 --steps 8
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gufo.engine.engine import Engine
from gufo.engine.graphs.decode import GraphDecoder
from gufo.options import RunOptions


def table(prof: profile, rows: int) -> str:
    return prof.key_averages().table(
        sort_by="self_device_time_total", row_limit=rows, max_name_column_width=60
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--prompt", type=int, default=2048, help="prefill tokens")
    parser.add_argument("--depth", type=int, default=0, help="tokens in the cache before the prefill")
    parser.add_argument("--steps", type=int, default=8, help="decode steps to profile")
    parser.add_argument("--rows", type=int, default=25, help="kernels to list")
    parser.add_argument("-ub", "--ubatch", type=int, default=2048, help="prefill chunk size")
    args = parser.parse_args()
    context = args.depth + args.prompt + args.steps + 8
    options = RunOptions(device="cuda", graphs=False)
    engine = Engine(args.model, options, context=context, batch_size=args.ubatch)
    rng = random.Random(0)
    tokens = [
        rng.randrange(engine.config.vocab_size) for _ in range(args.depth + args.prompt + args.steps + 1)
    ]
    if args.depth:
        engine.prefill(tokens[: args.depth])
    engine.prefill(tokens[args.depth : args.depth + args.prompt], start=args.depth)  # warm-up
    engine.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        engine.prefill(tokens[args.depth : args.depth + args.prompt], start=args.depth)
        engine.synchronize()
    print(f"## prefill of {args.prompt} tokens at depth {args.depth}\n{table(prof, args.rows)}")
    position = args.depth + args.prompt
    engine.decode(tokens[position], position)  # warm-up
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(1, args.steps + 1):
            engine.decode(tokens[position + i], position + i)
        engine.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    launches = sum(e.count for e in kernels) / args.steps
    busy_us = sum(e.self_device_time_total for e in kernels) / args.steps
    print(f"## {args.steps} eager decode steps at depth {position}: {launches:.0f} kernels/step")
    print(table(prof, args.rows))
    graphs = GraphDecoder(engine.model, engine.cache, torch.device("cuda"))
    graphs.decode([tokens[position]], position, 0)  # capture
    engine.synchronize()
    started = time.perf_counter()
    for i in range(1, args.steps + 1):
        graphs.decode([tokens[position + i]], position + i, 0)
    engine.synchronize()
    step_us = (time.perf_counter() - started) / args.steps * 1e6
    print(
        f"graph replay: {step_us:.0f} us/step; kernels busy {busy_us:.0f} us/step; "
        f"the other {step_us - busy_us:.0f} us over {launches:.0f} launches = "
        f"{(step_us - busy_us) / launches:.2f} us per launch"
    )


if __name__ == "__main__":
    main()

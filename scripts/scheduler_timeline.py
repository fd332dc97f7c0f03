"""Where a served wave's time goes in the engine: the real Scheduler around the real engine (what `gufo
serve` runs between its HTTP stack and the device), C greedy requests of `--prompt-tokens` distinct
prompt tokens and `--max-tokens` each, submitted at once, as `gufo bench-serve --concurrency C` sends a
wave.

Per concurrency, two waves after a discarded warm-up wave: the first untouched (its wall seconds and
aggregate tokens/s: the ceiling of a server without HTTP), the second with every engine call synchronized
and timed to its end (the device's work included): prefill calls (`prefill_parts`: a step's chunks, in
one pass where the engine packs them; count, tokens, ms), decode steps
(count, rows, ms) and the rest of the wave (the scheduler's host time and its waits).
The second wave runs slower than the first (no step is queued behind another): its parts say where the
time goes, the first wave what it adds up to.

    python scripts/scheduler_timeline.py --device cuda --row-products f16 -c 1,16,64 8B.gguf
    python scripts/scheduler_timeline.py --device cpu -c 1,4 --prompt-tokens 40 --max-tokens 8 small.gguf

One JSON object per concurrency on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from gufo.engine.engine import Engine, PrefillPart
from gufo.engine.params import SamplingParams
from gufo.options import PREFILL_PRODUCTS, ROW_PRODUCTS, KernelOptions, RunOptions
from gufo.server.metrics import Metrics
from gufo.server.scheduler import FinishEvent, Job, Scheduler
from gufo.server.settings import DEFAULT_PREFILL_CHUNK

GREEDY = SamplingParams(temperature=0.0)


def size(first: Any) -> int:
    """A call's tokens (prefill_parts: its parts' in all) or rows (decode_batch)."""
    parts = isinstance(first, list) and first and isinstance(first[0], PrefillPart)
    return sum(len(part.tokens) for part in first) if parts else len(first)


class Timings:
    """Each engine call's seconds (device synchronized before and after) while `on`, by method name."""

    def __init__(self, engine: Engine, names: tuple[str, ...]) -> None:
        self.on = False
        self.calls: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
        self._sync: Callable[[], None] = (
            torch.cuda.synchronize if torch.device(engine.device).type == "cuda" else (lambda: None)
        )
        for name in names:
            setattr(engine, name, self._timed(name, getattr(engine, name)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return method(*args, **kwargs)
            self._sync()
            start = time.perf_counter()
            result = method(*args, **kwargs)
            self._sync()
            self.calls[name].append((size(args[0]), time.perf_counter() - start))
            return result

        return call

    def clear(self) -> None:
        for calls in self.calls.values():
            calls.clear()


def prompts(count: int, length: int, vocab: int, wave: int) -> list[list[int]]:
    """`count` prompts of `length` ids that share no first token with each other or another wave's."""
    span = vocab - 1000
    return [[1000 + (977 * (wave * count + i) + 31 * j) % span for j in range(length)] for i in range(count)]


async def wave(scheduler: Scheduler, ids: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """Submit every prompt at once; wall seconds until the last request finished, tokens generated."""
    loop = asyncio.get_running_loop()
    jobs = [Job(p, max_tokens, GREEDY, loop, cache_prompt=False) for p in ids]
    start = time.perf_counter()
    for job in jobs:
        scheduler.submit(job)

    async def drain(job: Job) -> int:
        tokens = 0
        while not isinstance(event := await job.events.get(), FinishEvent):
            tokens += 1
        if event.reason == "error":
            raise RuntimeError(f"a request failed: {event.error}")
        return tokens

    counts = await asyncio.gather(*(drain(job) for job in jobs))
    return time.perf_counter() - start, sum(counts)


def summary(calls: list[tuple[int, float]]) -> dict[str, Any]:
    sizes = [size for size, _ in calls]
    return {
        "count": len(calls),
        "ms": round(1000 * sum(s for _, s in calls), 2),
        "ms_p50": round(1000 * statistics.median(s for _, s in calls), 3) if calls else None,
        "size_mean": round(statistics.fmean(sizes), 2) if sizes else None,
    }


def run(engine: Engine, scheduler: Scheduler, timings: Timings, c: int, args: argparse.Namespace) -> dict:
    vocab = engine.model.config.vocab_size
    asyncio.run(wave(scheduler, prompts(c, args.prompt_tokens, vocab, 0), min(args.max_tokens, 16)))
    seconds, tokens = asyncio.run(wave(scheduler, prompts(c, args.prompt_tokens, vocab, 1), args.max_tokens))
    timings.clear()
    timings.on = True
    timed_seconds, _ = asyncio.run(wave(scheduler, prompts(c, args.prompt_tokens, vocab, 2), args.max_tokens))
    timings.on = False
    parts = {name: summary(calls) for name, calls in timings.calls.items()}
    engine_ms = sum(part["ms"] for part in parts.values())
    return {
        "concurrency": c,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "wave_s": round(seconds, 4),
        "generated_tokens": tokens,
        "aggregate_tps": round(tokens / seconds, 2),
        "timed_wave_s": round(timed_seconds, 4),
        "timed": parts,
        "timed_rest_ms": round(1000 * timed_seconds - engine_ms, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a GGUF file")
    parser.add_argument("-c", "--concurrency", default="1,16,64", help="comma-separated requests per wave")
    parser.add_argument("--prompt-tokens", type=int, default=230, help="tokens of each prompt (default 230)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each request generates")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--row-products", choices=ROW_PRODUCTS, default="vector", help="as gufo serve's")
    parser.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK, help="as gufo serve's")
    parser.add_argument("--prefill-products", choices=PREFILL_PRODUCTS, default="cublas", help="as serve's")
    parser.add_argument("--prefill-batch", type=int, default=None, help="as gufo serve's")
    parser.add_argument("--ctx", type=int, default=768, help="context per session (default 768)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    kernels = KernelOptions(row_products=args.row_products, prefill_products=args.prefill_products)
    options = RunOptions(device=args.device, kernels=kernels)
    engine = Engine(args.file, options, context=args.ctx, n_slots=max(levels), batch_size=args.prefill_chunk)
    engine.prepare_rows(engine.cache.n_slots)  # as the server does before its first request
    scheduler = Scheduler(
        engine, Metrics(), max(levels), prefill_chunk=args.prefill_chunk, prefill_batch=args.prefill_batch
    )
    engine.prepare_prefill(args.prefill_chunk, scheduler.prefill_batch)
    timings = Timings(engine, ("prefill_parts", "decode_batch"))
    scheduler.start()
    try:
        for c in levels:
            row = {
                "route": engine.model.decode_route.name,
                "prefill_batch": scheduler.prefill_batch,
                "prefill_products": args.prefill_products,
                **run(engine, scheduler, timings, c, args),
            }
            print(json.dumps(row), flush=True)
    finally:
        scheduler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

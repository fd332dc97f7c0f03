"""GPU check and timing of the prefill graphs (`gufo.engine.graphs.prefill`) as `gufo serve` runs them:
one set of piecewise graphs per chunk length (bucket: powers of two from 16, then -b), every slot, tail
chunks padded. For a GGUF file and each prompt length, against an engine that prefills eagerly:

- prompts whose chunks all fill their bucket (16, 32, ..., -b tokens each): bit for bit equal;
- a padded tail chunk runs its products over the bucket's rows, so their tiles and order of sums may
  differ from eager's over the chunk's own rows (the server pads alike for every request, so its output
  stays a function of the request): every token's logits finite, and the same top-1 token wherever
  eager's lead over its runner-up exceeds the largest difference of that token's logits (else a
  near-tie, reported), as `--validate-prefill` asks of decode against prefill; the cosine is reported;
- the same prompt in slot 1 after slot 0: bit-identical logits and KV (one set of graphs for all slots);
- the prompt again in slot 0 after the other lengths ran: bit-identical logits;
- prefill time, median of --repeats runs after a warm-up, eager and replayed (the graphs captured first
  by `Engine.prepare_prefill`, as the server does at load; the capture time is reported).

Prints one JSON object on stdout, then PASS (exit 0) or FAIL (exit 1).

    python scripts/prefill_graphs_check.py FILE.gguf
    python scripts/prefill_graphs_check.py --batch 512 --lengths 1,16,100,212,512,700 FILE.gguf
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch

from gufo.engine.engine import Engine
from gufo.engine.graphs import chunks
from gufo.options import RunOptions
from gufo.tools.quality.logit_diff import compare_logits

LENGTHS = (1, 7, 16, 33, 64, 100, 128, 200, 212, 256, 300, 400, 512, 700, 1024)


def timed_ms(engine: Engine, prompt: list[int], repeats: int) -> float:
    engine.prefill(prompt)  # warm-up: kernels compiled, graphs captured
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        engine.prefill(prompt)  # the logits come back to the host: the prefill has finished
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def compare_rows(want: torch.Tensor, got: torch.Tensor) -> dict:
    diffs = [compare_logits(w, g) for w, g in zip(want, got, strict=True)]
    swapped = [i for i, d in enumerate(diffs) if not d.top1_match and d.reference_margin > d.max_abs_diff]
    ties = [i for i, d in enumerate(diffs) if not d.top1_match and d.reference_margin <= d.max_abs_diff]
    return {
        "bit_identical": bool(torch.equal(want, got)),
        "finite": all(d.finite for d in diffs),
        "cosine_min": min(d.cosine for d in diffs),
        "max_abs_diff": max(d.max_abs_diff for d in diffs),
        "max_logit": float(want.abs().max()),
        "top1_swapped": swapped,  # positions whose top-1 changed although eager's lead was wider
        "near_ties_swapped": ties,
    }


def kv_equal(engine: Engine, length: int) -> bool:
    """Whether slots 0 and 1 hold the same keys and values at positions 0..length - 1."""
    cache = engine.cache
    for layer in range(len(cache.keys)):
        pairs = zip(cache.entries(layer, 0, length), cache.entries(layer, 1, length), strict=True)
        if not all(torch.equal(a, b) for a, b in pairs):
            return False
    return True


def check(path: str, batch: int, context: int, lengths: list[int], repeats: int) -> dict:
    graphed = Engine(path, RunOptions(device="cuda"), context=context, n_slots=2, batch_size=batch)
    eager = Engine(path, RunOptions(device="cuda", graphs=False), context=context, batch_size=batch)
    if graphed.prefill_graphs is None:
        raise SystemExit(f"{path}: this model keeps the eager prefill (hybrid, experts or no GPU graphs)")
    started = time.perf_counter()
    graphed.prepare_prefill(batch)
    capture_s = time.perf_counter() - started
    rng = random.Random(1234)
    vocab = graphed.config.vocab_size
    prompts = {n: [rng.randrange(vocab) for _ in range(n)] for n in lengths}
    results, first = [], {}
    for n, prompt in prompts.items():
        sizes = [chunks.bucket(min(batch, n - b), batch) for b in range(0, n, batch)]
        full = all(size == min(batch, n - b) for size, b in zip(sizes, range(0, n, batch), strict=True))
        want = eager.prefill(prompt, all_logits=True)
        got = first[n] = graphed.prefill(prompt, slot=0, all_logits=True)
        rows = compare_rows(want, got)
        other_slot = graphed.prefill(prompt, slot=1, all_logits=True)
        results.append(
            {
                "tokens": n,
                "buckets": sizes,
                "fills_buckets": full,
                **rows,
                "slots_equal": bool(torch.equal(got, other_slot)) and kv_equal(graphed, n),
                "eager_ms": timed_ms(eager, prompt, repeats),
                "graphs_ms": timed_ms(graphed, prompt, repeats),
            }
        )
    for result in results:  # again, after every other length ran through the same buffers
        again = graphed.prefill(prompts[result["tokens"]], slot=0, all_logits=True)
        result["repeat_equal"] = bool(torch.equal(again, first[result["tokens"]]))
        result["speedup"] = result["eager_ms"] / result["graphs_ms"]
        result["pass"] = (
            result["finite"]
            and not result["top1_swapped"]
            and (result["bit_identical"] or not result["fills_buckets"])
            and result["slots_equal"]
            and result["repeat_equal"]
        )
    return {
        "file": path,
        "device": torch.cuda.get_device_name(),
        "batch": batch,
        "context": context,
        "buckets": list(chunks.buckets(batch)),
        "capture_s": capture_s,
        "prefill_capture_s": graphed.prefill_graphs.capture_seconds,
        "lengths": results,
        "pass": all(result["pass"] for result in results),
    }


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("model", help="GGUF file")
    parser.add_argument("--batch", type=int, default=512, help="-b, as gufo serve's default (512)")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths, commas")
    parser.add_argument("--repeats", type=int, default=10, help="timed prefills per length and engine")
    args = parser.parse_args()
    lengths = [int(part) for part in args.lengths.split(",")]
    report = check(args.model, args.batch, args.context, lengths, args.repeats)
    print(json.dumps(report, indent=1))
    print("PASS" if report["pass"] else "FAIL")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

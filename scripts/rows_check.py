"""GPU check of the batched decode rows (what `gufo serve` runs for its active requests): for a GGUF file,
`--rows` sequences (default 18) of different lengths in as many slots, steps of `Engine.decode_batch`
(graph replays of up to 16 rows, or 64 on the tensor-core rows' route, slots out of order; then 4 of the
sequences; then 2; then a bit over half of them, a padded bucket on the 64-row route; then all again)
against each row's own one-token step (`Engine.decode`) on a second engine: prints the decode route, the
largest difference per step, and for a model with recurrent state (qwen35) whether every slot's state is
bit for bit its one-row steps' after the steps; prints PASS and exits 0 when every row and every state is
bit for bit equal, else FAIL, 1.

    python scripts/rows_check.py FILE.gguf [FILE.gguf ...]
    python scripts/rows_check.py --row-products tensor --rows 64 FILE.gguf   # the 64-row buckets
    python scripts/rows_check.py --row-products tensor --time --rows 64 FILE.gguf

`--profile` skips the check and profiles (torch.profiler; CUPTI records the kernels inside graph replays)
a few `decode_batch` steps of `--rows` rows: the kernels' GPU time per step, largest first. (Without
graphs the steps would run row by row, not what a server's step runs.)

`--time` skips the check and times `decode_batch` alone (graph replays, the logits left on the device as
for the server's greedy rows; no sampling or serving), to split a server step's time into the engine's and
the rest: one JSON object per file on stdout, with the route, the most rows per replay and, per row count
timed (1, 2, 4, 8, 16, each bucket past 16 up to `--rows`, and `--rows` itself: several replays where it
passes the route's rows), the bucket replayed and ms per step and per row.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from gufo.engine.engine import Engine
from gufo.engine.graphs import rows as buckets
from gufo.options import ROW_PRODUCTS, KernelOptions, RunOptions

ROWS = 18
TIMED_ROWS = (1, 2, 4, 8, 16)  # row counts timed besides the buckets past 16


def check(path: str, options: RunOptions, rows: int) -> bool:
    prompts = [[(7 * i + j) % 500 + 1 for j in range(1 + 3 * (i % 5))] for i in range(rows)]
    order = [*range(1, rows, 2), *range(0, rows, 2)][::-1]  # slots out of order
    engines = [Engine(path, options, context=256, n_slots=rows) for _ in range(2)]
    for engine in engines:
        for slot, prompt in enumerate(prompts):
            engine.prefill(prompt, slot=slot)
    alone, batched = engines
    route = batched.model.decode_route
    print(f"{path}: route {route.name}, up to {route.max_tokens} rows per replay", flush=True)
    positions = {slot: len(prompt) for slot, prompt in enumerate(prompts)}
    equal = True
    for step, slots in enumerate((order, order[:4], order[4:6], order[: rows // 2 + 1], order)):
        tokens = [40 + step + s for s in slots]
        at = [positions[s] for s in slots]
        want = torch.stack([alone.decode(t, p, s) for t, p, s in zip(tokens, at, slots, strict=True)])
        got = batched.decode_batch(tokens, at, slots).cpu()
        same = [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]
        diff = float((got - want).abs().max())
        print(f"{path} step {step}: rows equal {sum(same)}/{len(slots)} max_abs_diff {diff:.3e}", flush=True)
        equal &= all(same)
        positions.update((s, p + 1) for s, p in zip(slots, at, strict=True))
    if batched.cache.recurrent is not None:
        states = [(alone.cache.recurrent.save(s), batched.cache.recurrent.save(s)) for s in range(rows)]
        same = [all(torch.equal(a, b) for a, b in zip(*pair, strict=True)) for pair in states]
        print(f"{path} recurrent state: slots equal {sum(same)}/{rows}", flush=True)
        equal &= all(same)
    return equal


def time_steps(path: str, options: RunOptions, rows: int, steps: int = 50) -> dict:
    engine = Engine(path, options, context=512, n_slots=rows)
    for slot in range(rows):
        engine.prefill([slot + 1] * 200, slot=slot)
    engine.prepare_rows(rows)
    route = engine.model.decode_route
    most = route.max_tokens or 1
    wide = [size for size in buckets.buckets(most) if size > buckets.EXACT_ROWS]
    timed = []
    for count in sorted({n for n in (*TIMED_ROWS, *wide, rows) if n <= rows}):
        slots = list(range(count))
        for warm in (True, False):
            engine.synchronize()
            started = time.perf_counter()
            for i in range(3 if warm else steps):
                engine.decode_batch([7] * count, [200 + i] * count, slots)
            engine.synchronize()
        ms = (time.perf_counter() - started) * 1e3 / steps
        bucket = buckets.bucket(min(count, most), most)  # a larger step replays several
        timed.append({"rows": count, "bucket": bucket, "ms_per_step": ms, "ms_per_row": ms / count})
    return {"file": path, "route": route.name, "max_rows": most, "steps": steps, "rows": timed}


def profile_steps(path: str, options: RunOptions, rows: int, steps: int = 3) -> None:
    engine = Engine(path, options, context=1024, n_slots=rows)
    for slot in range(rows):
        engine.prefill([slot + 1] * 200, slot=slot)
    engine.prepare_rows(rows)
    slots = list(range(rows))
    engine.decode_batch([7] * rows, [200] * rows, slots)  # compiles the kernels
    engine.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            engine.decode_batch([7] * rows, [201 + i] * rows, slots)
        engine.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0]
    events.sort(key=lambda e: e.device_time_total, reverse=True)
    total = sum(e.device_time_total for e in events) / steps
    print(f"{path}: {rows} rows, {total / 1e3:.2f} ms of kernels per step", flush=True)
    for e in events[:30]:
        per_step = e.device_time_total / steps
        print(f"{per_step / 1e3:9.3f} ms {100 * per_step / total:5.1f}% {e.count // steps:5d}x {e.key[:100]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--time", action="store_true", help="time decode_batch steps instead of checking")
    parser.add_argument(
        "--profile", action="store_true", help="profile decode_batch steps' kernels instead of checking"
    )
    parser.add_argument(
        "--rows", type=int, default=None, help=f"concurrent sequences (default {ROWS}; --time: 16)"
    )
    parser.add_argument(
        "--row-products", choices=ROW_PRODUCTS, default="vector", help="KernelOptions.row_products"
    )
    args = parser.parse_args()
    if args.rows is not None and args.rows < (1 if args.time or args.profile else 6):
        parser.error("--rows: at least 6 sequences to check (the steps take 4, then 2 others), 1 to time")
    options = RunOptions(device="cuda", kernels=KernelOptions(row_products=args.row_products))
    if args.profile:
        for path in args.files:
            profile_steps(path, options, args.rows or 16)
        return 0
    if args.time:
        for path in args.files:
            print(json.dumps(time_steps(path, options, args.rows or 16)), flush=True)
        return 0
    results = [check(path, options, args.rows or ROWS) for path in args.files]
    print("PASS" if all(results) else "FAIL", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU check of the batched decode rows (what `gufo serve` runs for its active requests): for a GGUF file,
18 sequences of different lengths in 18 slots, steps of `Engine.decode_batch` (graph replays of 16 rows
then 2, slots out of order; then 4 of the sequences; then 2; then all again) against each row's own
one-token step (`Engine.decode`) on a second engine: prints the largest difference per step, and for a
model with recurrent state (qwen35) whether every slot's state is bit for bit its one-row steps' after
the steps; prints PASS and exits 0 when every row and every state is bit for bit equal, else FAIL, 1.

    python scripts/rows_check.py FILE.gguf [FILE.gguf ...]
    python scripts/rows_check.py --time FILE.gguf     # ms per decode_batch step of 1, 2, 4, 8, 16 rows
    python scripts/rows_check.py --row-products tensor [--time] FILE.gguf   # on the tensor-core rows

`--time` skips the check and times `decode_batch` alone (graph replays, the logits left on the device as
for the server's greedy rows; no sampling or serving), to split a server step's time into the engine's and
the rest.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from gufo.engine.engine import Engine
from gufo.options import ROW_PRODUCTS, KernelOptions, RunOptions

ROWS = 18


def check(path: str, options: RunOptions) -> bool:
    prompts = [[(7 * i + j) % 500 + 1 for j in range(1 + 3 * (i % 5))] for i in range(ROWS)]
    order = [(5 * i) % ROWS for i in range(ROWS)]
    engines = [Engine(path, options, context=256, n_slots=ROWS) for _ in range(2)]
    for engine in engines:
        for slot, prompt in enumerate(prompts):
            engine.prefill(prompt, slot=slot)
    alone, batched = engines
    positions = {slot: len(prompt) for slot, prompt in enumerate(prompts)}
    equal = True
    for step, slots in enumerate((order, order[:4], order[4:6], order)):
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
        states = [(alone.cache.recurrent.save(s), batched.cache.recurrent.save(s)) for s in range(ROWS)]
        same = [all(torch.equal(a, b) for a, b in zip(*pair, strict=True)) for pair in states]
        print(f"{path} recurrent state: slots equal {sum(same)}/{ROWS}", flush=True)
        equal &= all(same)
    return equal


def time_steps(path: str, options: RunOptions, steps: int = 50) -> None:
    engine = Engine(path, options, context=1024, n_slots=16)
    for slot in range(16):
        engine.prefill([slot + 1] * 200, slot=slot)
    engine.prepare_rows(16)
    for rows in (1, 2, 4, 8, 16):
        slots = list(range(rows))
        for warm in (True, False):
            engine.synchronize()
            started = time.perf_counter()
            for i in range(3 if warm else steps):
                engine.decode_batch([7] * rows, [200 + i] * rows, slots)
            engine.synchronize()
        ms = (time.perf_counter() - started) * 1e3 / steps
        print(f"{path}: {rows:2d} rows {ms:7.3f} ms/step {ms / rows:6.3f} ms/row", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--time", action="store_true", help="time decode_batch steps instead of checking")
    parser.add_argument(
        "--row-products", choices=ROW_PRODUCTS, default="vector", help="KernelOptions.row_products"
    )
    args = parser.parse_args()
    options = RunOptions(device="cuda", kernels=KernelOptions(row_products=args.row_products))
    if args.time:
        for path in args.files:
            time_steps(path, options)
        return 0
    results = [check(path, options) for path in args.files]
    print("PASS" if all(results) else "FAIL", flush=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU check of the batched decode rows (what `gufo serve` runs for its active requests): for a GGUF file,
18 sequences of different lengths in 18 slots, two steps of `Engine.decode_batch` (graph replays of 16
rows, then 2, slots out of order) against each row's own one-token step (`Engine.decode`) on a second
engine: prints the largest difference per step and exits 1 unless every row is bit for bit equal.

    python scripts/rows_check.py FILE.gguf [FILE.gguf ...]
    python scripts/rows_check.py --time FILE.gguf     # ms per decode_batch step of 1, 2, 4, 8, 16 rows

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
from gufo.options import RunOptions

ROWS = 18


def check(path: str) -> bool:
    prompts = [[(7 * i + j) % 500 + 1 for j in range(1 + 3 * (i % 5))] for i in range(ROWS)]
    slots = [(5 * i) % ROWS for i in range(ROWS)]
    engines = [Engine(path, RunOptions(device="cuda"), context=256, n_slots=ROWS) for _ in range(2)]
    for engine in engines:
        for slot, prompt in enumerate(prompts):
            engine.prefill(prompt, slot=slot)
    alone, batched = engines
    positions = [len(prompts[s]) for s in slots]
    equal = True
    for step in range(2):
        tokens = [40 + step + s for s in slots]
        want = torch.stack([alone.decode(t, p, s) for t, p, s in zip(tokens, positions, slots, strict=True)])
        got = batched.decode_batch(tokens, positions, slots).cpu()
        same = [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]
        diff = float((got - want).abs().max())
        print(f"{path} step {step}: rows equal {sum(same)}/{ROWS} max_abs_diff {diff:.3e}", flush=True)
        equal &= all(same)
        positions = [p + 1 for p in positions]
    return equal


def time_steps(path: str, steps: int = 50) -> None:
    engine = Engine(path, RunOptions(device="cuda"), context=1024, n_slots=16)
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
    args = parser.parse_args()
    if args.time:
        for path in args.files:
            time_steps(path)
        return 0
    results = [check(path) for path in args.files]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU check of the batched decode rows (what `gufo serve` runs for its active requests): for a GGUF file,
18 sequences of different lengths in 18 slots, two steps of `Engine.decode_batch` (graph replays of 16
rows, then 2, slots out of order) against each row's own one-token step (`Engine.decode`) on a second
engine: prints the largest difference per step and exits 1 unless every row is bit for bit equal.

    python scripts/rows_check.py FILE.gguf [FILE.gguf ...]
"""

from __future__ import annotations

import argparse
import sys

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
        got = batched.decode_batch(tokens, positions, slots)
        same = [bool(torch.equal(g, w)) for g, w in zip(got, want, strict=True)]
        diff = float((got - want).abs().max())
        print(f"{path} step {step}: rows equal {sum(same)}/{ROWS} max_abs_diff {diff:.3e}", flush=True)
        equal &= all(same)
        positions = [p + 1 for p in positions]
    return equal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    results = [check(path) for path in parser.parse_args().files]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The GPU acceptance check of `gufo profile` (issue 24, acceptance 2), on a GPU machine.

Runs `gufo profile` and `gufo bench` on one model with the same decode workload (`-p 0 -n N`), then
checks and prints:
1. the decode stage table: the products (`linear.*`, `experts.*`) must be there with their GB/s;
2. the decode stages' device time per token (every decode row but `host overhead`: what the kernels
   take) against bench's tg time per token, which replays CUDA graphs and so pays almost no launch
   gaps; they must agree within 10%;
3. the `--trace` file's structure (Chrome/Perfetto JSON: a traceEvents list; complete events "X" with
   ts, dur, pid and tid; device kernels among them);
and writes `--debug-events` (events.txt: the events per activity type, how the device kernels were
placed, raw fields of the first events and of the first pass's device events) beside the JSON, so
that an attribution that still fails comes with the data to fix it. Exits 1 when a check fails.

    python scripts/profile_gpu_check.py qwen3-8b-q4_k_m.gguf --out profile-check [--peak-bandwidth 4800]
    python scripts/profile_gpu_check.py smollm2-135m --device cpu -n 4     # smoke run of the script
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TOLERANCE = 0.10  # acceptance: device time per token within 10% of bench's tg time per token
GUFO = [sys.executable, "-c", "import sys; from gufo.cli.main import main; sys.exit(main(sys.argv[1:]))"]
PRODUCTS = ("linear.", "experts.")


def gufo(args: list[str], stdout: Path) -> list[dict]:
    """Run gufo with `args` (progress on stderr), its JSON output kept in `stdout`."""
    print("$ gufo " + " ".join(args), file=sys.stderr, flush=True)
    with stdout.open("w") as out:
        subprocess.run([*GUFO, *args], stdout=out, check=True)
    return json.loads(stdout.read_text())


def trace_problems(path: Path) -> list[str]:
    """What keeps the trace from being a Chrome/Perfetto trace with the run's kernels in it."""
    try:
        events = json.loads(path.read_text())["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"not a trace: {err!r}"]
    if not isinstance(events, list) or not events:
        return ["traceEvents is not a non-empty list"]
    problems = []
    if any(not isinstance(e, dict) or "ph" not in e for e in events):
        problems.append("an event without ph")
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    missing = [e for e in complete if not {"ts", "dur", "pid", "tid", "name"} <= e.keys()]
    if missing:
        problems.append(f"{len(missing)} complete events without ts/dur/pid/tid/name, e.g. {missing[0]}")
    numeric = (int, float)
    if not complete or not all(
        isinstance(e.get("ts"), numeric) and isinstance(e.get("dur"), numeric) for e in complete
    ):
        problems.append("no complete (ph X) events, or some without numeric ts/dur")
    if not any(e.get("cat") == "kernel" for e in complete):
        problems.append("no device kernels (cat kernel)")
    if not any(e.get("name") == "gufo.decode" for e in complete):
        problems.append("no gufo.decode range")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="GGUF file (the 8B Q4_K_M synth file)")
    parser.add_argument("--out", type=Path, default=Path("profile-check"), help="folder for the outputs")
    parser.add_argument("-n", type=int, default=32, help="tokens generated (default 32)")
    parser.add_argument("--device", default="cuda", help="default cuda (cpu: a smoke run of this script)")
    parser.add_argument("--peak-bandwidth", help="the device's GB/s, passed to gufo profile for %% of peak")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    workload = ["-m", args.model, "--device", args.device, "-p", "0", "-n", str(args.n), "-o", "json"]
    extra = ["--peak-bandwidth", args.peak_bandwidth] if args.peak_bandwidth else []
    trace, events = args.out / "trace.json", args.out / "events.txt"
    profile_rows = gufo(
        ["profile", *workload, *extra, "--trace", str(trace), "--debug-events", str(events)],
        args.out / "profile.json",
    )
    bench_rows = gufo(["bench", *workload], args.out / "bench.json")
    (profiled,) = [row for row in profile_rows if row["test"] == f"tg{args.n}"]
    (benched,) = [row for row in bench_rows if row["test"] == f"tg{args.n}"]
    failures = []

    decode = [s for s in profiled["profile"]["stages"] if s["phase"] == "decode"]
    print(
        f"\n## decode stages, {profiled['model_type']}, tg{args.n}, {profiled['profile']['repetitions']} reps"
    )
    print("| stage | launches | us/token | share | GB/s | % peak |\n|---|---:|---:|---:|---:|---:|")
    for s in decode:
        gbs = "" if s["gb_per_s"] is None else f"{s['gb_per_s']:.1f}"
        peak = "" if s["peak_pct"] is None else f"{s['peak_pct']:.1f}"
        cells = (s["stage"], s["launches"], f"{s['per_token_us']:.1f}", f"{s['share_pct']:.1f}%", gbs, peak)
        print("| " + " | ".join(map(str, cells)) + " |")
    products = [s for s in decode if s["stage"].startswith(PRODUCTS)]
    if not products or any(s["gb_per_s"] is None or s["per_token_us"] <= 0 for s in products):
        failures.append("the decode table has no product stages with device time and GB/s")

    device_us = sum(s["per_token_us"] for s in decode if s["stage"] != "host overhead")
    overhead_us = sum(s["per_token_us"] for s in decode if s["stage"] == "host overhead")
    bench_us = benched["avg_ns"] / benched["n_gen"] / 1e3
    ratio = device_us / bench_us
    print(
        f"\ndecode device time {device_us:.1f} us/token (+ host overhead {overhead_us:.1f} uncaptured); "
        f"gufo bench tg{args.n} {bench_us:.1f} us/token ({1e6 / bench_us:.1f} t/s): ratio {ratio:.3f}, "
        f"{'within' if abs(ratio - 1) <= TOLERANCE else 'NOT within'} {TOLERANCE:.0%}"
    )
    if abs(ratio - 1) > TOLERANCE:
        failures.append(f"device time per token {device_us:.1f} us vs bench {bench_us:.1f} us")

    problems = trace_problems(trace)
    print(
        f"trace {trace}: "
        + ("Chrome/Perfetto structure, kernels in it" if not problems else "; ".join(problems))
    )
    failures += [f"trace: {p}" for p in problems]

    print(f"events {events}:\n  " + "\n  ".join(events.read_text().splitlines()[:2]))
    for failure in failures:
        print(f"FAIL: {failure}")
    print("PASS" if not failures else f"{len(failures)} check(s) failed: send {args.out}/ back")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""`gufo profile`: `gufo bench`'s workload (gufo.tools.bench.session) under torch.profiler.

torch.profiler is PyTorch's own tracer (Kineto: CUPTI on NVIDIA, roctracer on ROCm, host events on the
CPU), so what is measured is what every PyTorch tool reads, and the trace opens in Perfetto. The model
is loaded before the profiler starts; each timed repetition runs inside a range of its own, and only
those count (the warm-up and the depth prefill stay in the trace, outside the tables).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gufo.tools.bench.runner import Progress
from gufo.tools.bench.session import BenchPlan, EngineCache, preflight, run_benchmarks
from gufo.tools.bench.workload import BenchTest
from gufo.tools.profile.report import profile_fields
from gufo.tools.profile.stages import attribute, describe, repetition_range


class RepetitionRanges:
    """The `around_repetition` hook: a range per timed repetition, numbered by test as they come."""

    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, test: BenchTest, repetition: int) -> record_function:
        if repetition == 0:
            self.sequence += 1
        return record_function(repetition_range(self.sequence, repetition))


@dataclass(frozen=True)
class ProfilePlan:
    bench: BenchPlan  # one model; its options carry ProfileOptions
    trace: Path | None = None  # where to write the Chrome/Perfetto trace
    peak_gbs: float | None = None  # the device's memory bandwidth, for % of peak
    events: Path | None = None  # where to describe the profiler's events and their placement (debugging)


def run_profile(
    plan: ProfilePlan, build: dict[str, object], progress: Progress | None = None
) -> list[dict[str, object]]:
    """One bench row per test, each with its `profile` object."""
    report = progress or (lambda _message: None)
    preflight(plan.bench)
    ranges = RepetitionRanges()
    bench = replace(plan.bench, around_repetition=ranges)
    engines = EngineCache(bench)
    engine = engines.get(bench.models[0])  # loaded before the profiler starts
    device = torch.device(engine.device).type
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as profiler:
        records = list(run_benchmarks(bench, engines, {}, build, progress))
    events = profiler.profiler.kineto_results.events()
    report(f"reading {len(events)} profiler events")
    per_test = attribute(events, device=device == "cuda")
    if plan.events is not None:
        report(f"describing the events in {plan.events}")
        plan.events.write_text(describe(events))
    if plan.trace is not None:
        report(f"writing the trace to {plan.trace}")
        profiler.export_chrome_trace(str(plan.trace))
    tests = [test for _ in range(len(records) // max(len(bench.tests), 1)) for test in bench.tests]
    return [
        {**record, "profile": profile_fields(test, per_test.get(index, []), device, plan.peak_gbs)}
        for index, (record, test) in enumerate(zip(records, tests, strict=True), 1)
    ]

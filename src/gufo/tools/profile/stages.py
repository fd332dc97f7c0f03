"""Where a profiled repetition's time went, per stage, from torch.profiler's events.

The engine's kernel calls run inside ranges named by stage (gufo.kernels.profiling), its passes inside
`gufo.prefill` / `gufo.decode`, and `gufo profile` puts each timed repetition inside a range of its
own (`repetition_range`). On the CPU a stage's time is its ranges' time, less that of stage ranges
nested in them; the rest of a pass is `other`. On a GPU a stage's time is that of the device kernels
launched inside its ranges (found by the correlation id that links a kernel to the host op that
launched it); kernels launched outside every stage are `copy` (memory copies and sets) or `other`, and
the time the device sat idle during a pass is `host overhead`. Time inside a repetition but outside the
engine's passes (the runner's loop, sampling and drafting in speculative tests) is `between_passes`.

The events are read as Kineto gives them (`prof.profiler.kineto_results.events()`): building
torch's FunctionEvent tree costs seconds for what is read here in milliseconds.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gufo.kernels.profiling import PHASE_OF_RANGE, KernelRange

REPETITION_PREFIX = "gufo.repetition "
BETWEEN_PASSES, OTHER, COPY, HOST_OVERHEAD = "between_passes", "other", "copy", "host overhead"
NO_PHASE = "-"  # the phase of the time between passes
HOST_OPS = ("cpu_op", "user_annotation")  # Kineto's activity types of torch ops and record_function ranges
DEVICE_ACTIVITIES = {"kernel": OTHER, "gpu_memcpy": COPY, "gpu_memset": COPY}  # -> their stage outside ranges


def activity(event: Any) -> str:
    """Kineto's activity type of `event`. torch 2.11 (the GPU machines') has no `activity_type()`: there
    it is told from the device and the names CUPTI gives copies ("Memcpy HtoD ...") and fills
    ("Memset ...")."""
    if hasattr(event, "activity_type"):
        return event.activity_type()
    if event.device_type().name == "CPU":
        return "cpu_op"
    name = event.name()
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    return "gpu_memset" if name.startswith("Memset") else "kernel"


def repetition_range(sequence: int, repetition: int) -> str:
    """The name of the range around repetition `repetition` of the `sequence`-th test of a run (from 1)."""
    return f"{REPETITION_PREFIX}{sequence}/{repetition}"


def parse_repetition(name: str) -> tuple[int, int] | None:
    if not name.startswith(REPETITION_PREFIX):
        return None
    sequence, _, repetition = name.removeprefix(REPETITION_PREFIX).partition("/")
    return int(sequence), int(repetition)


@dataclass
class Tally:
    launches: int = 0
    ns: int = 0
    bytes: int = 0

    def add(self, ns: int, launches: int = 1, n_bytes: int = 0) -> None:
        self.launches += launches
        self.ns += ns
        self.bytes += n_bytes


@dataclass
class RepetitionProfile:
    """One timed repetition: (phase, stage) and (phase, stage, kernel) -> their tally."""

    ns: int  # the repetition's range
    stages: dict[tuple[str, str], Tally] = field(default_factory=dict)
    kernels: dict[tuple[str, str, str], Tally] = field(default_factory=dict)

    def stage(self, phase: str, stage: str) -> Tally:
        return self.stages.setdefault((phase, stage), Tally())

    def kernel(self, phase: str, stage: str, kernel: str) -> Tally:
        return self.kernels.setdefault((phase, stage, kernel), Tally())


@dataclass
class Node:
    """A range of ours (repetition, pass or kernel call) on one thread, with the ranges inside it."""

    name: str
    start: int
    end: int
    children: list[Node] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # the children's starts, for bisection

    @property
    def ns(self) -> int:
        return self.end - self.start

    def innermost(self, time: int) -> list[Node]:
        """The chain of ranges under this one that contain `time`, outermost first."""
        chain, node = [], self
        while True:
            index = bisect.bisect_right(node.starts, time) - 1
            if index < 0 or node.children[index].end < time:
                return chain
            node = node.children[index]
            chain.append(node)


def ours(name: str) -> bool:
    return name in PHASE_OF_RANGE or name.startswith(REPETITION_PREFIX) or KernelRange.parse(name) is not None


def forest(ranges: Iterable[tuple[int, str, int, int]]) -> dict[int, Node]:
    """Per thread, a root whose descendants are the ranges (thread, name, start, end), nested by time."""
    roots: dict[int, Node] = {}
    stacks: dict[int, list[Node]] = {}
    for thread, name, start, end in sorted(ranges, key=lambda r: (r[0], r[2], -r[3])):
        stack = stacks.setdefault(thread, [roots.setdefault(thread, Node("", 0, 2**63))])
        while stack[-1].end < end:  # a range ends before this one does: not its parent
            stack.pop()
        node = Node(name, start, end)
        stack[-1].children.append(node)
        stack[-1].starts.append(start)
        stack.append(node)
    return roots


def attribute(events: list[Any], device: bool) -> dict[int, list[RepetitionProfile]]:
    """Test sequence number -> its repetitions' profiles, from Kineto's events (`device`: time the GPU
    kernels, else the host ranges)."""
    host = [e for e in events if e.device_type().name == "CPU"]
    roots = forest((e.start_thread_id(), e.name(), e.start_ns(), e.end_ns()) for e in host if ours(e.name()))
    out: dict[int, list[RepetitionProfile]] = {}
    by_repetition: dict[int, RepetitionProfile] = {}
    for root in roots.values():
        for node in root.children:
            numbers = parse_repetition(node.name)
            if numbers is None:
                continue
            profile = RepetitionProfile(node.ns)
            out.setdefault(numbers[0], []).append(profile)
            by_repetition[id(node)] = profile
            _passes(node, profile, device)
    if device:
        _device_kernels(events, host, roots, by_repetition)
    return out


def _passes(repetition: Node, profile: RepetitionProfile, device: bool) -> None:
    """Tally the kernel ranges of a repetition (their host time unless `device`) and its passes' rest."""
    passes = 0

    def visit(node: Node, phase: str) -> int:
        """The time of the outermost kernel ranges at or under `node`."""
        phase = PHASE_OF_RANGE.get(node.name, phase)
        inner = sum(visit(child, phase) for child in node.children)
        found = KernelRange.parse(node.name)
        if found is None:
            return inner
        own = 0 if device else node.ns - inner  # on a GPU the kernels' time is added later
        profile.stage(phase, found.stage).add(own, n_bytes=found.bytes)
        if not device:
            profile.kernel(phase, found.stage, found.kernel).add(own, n_bytes=found.bytes)
        return node.ns

    for child in repetition.children:
        if child.name not in PHASE_OF_RANGE:
            continue
        passes += child.ns
        covered = visit(child, NO_PHASE)
        if not device:
            profile.stage(PHASE_OF_RANGE[child.name], OTHER).add(child.ns - covered, launches=0)
    profile.stage(NO_PHASE, BETWEEN_PASSES).add(repetition.ns - passes, launches=0)


def _device_kernels(
    events: list[Any], host: list[Any], roots: dict[int, Node], by_repetition: dict[int, RepetitionProfile]
) -> None:
    """Each device kernel to the stage range its launching host op ran in; each pass's idle time."""
    # a kernel links to the host op (or range) it was launched in; the launch calls' own correlation ids
    # (CUPTI's) are another numbering
    ops = (e for e in host if activity(e) in HOST_OPS)
    launched_at = {e.correlation_id(): (e.start_thread_id(), e.start_ns()) for e in ops}
    busy: dict[int, list[tuple[int, int]]] = {}  # id(pass range) -> its kernels' intervals
    for event in events:
        outside = DEVICE_ACTIVITIES.get(activity(event))
        where = launched_at.get(event.linked_correlation_id())
        if event.device_type().name == "CPU" or outside is None or where is None or where[0] not in roots:
            continue
        chain = roots[where[0]].innermost(where[1])
        passes = [node for node in chain[1:2] if node.name in PHASE_OF_RANGE]
        if not passes or id(chain[0]) not in by_repetition:
            continue  # outside the timed passes (a warm-up, a depth prefill, the runner's loop)
        profile, phase = by_repetition[id(chain[0])], PHASE_OF_RANGE[passes[0].name]
        found = next((s for s in map(KernelRange.parse, (n.name for n in reversed(chain))) if s), None)
        stage = outside if found is None else found.stage
        profile.stage(phase, stage).add(event.duration_ns(), launches=0)
        profile.kernel(phase, stage, event.name()).add(event.duration_ns())
        busy.setdefault(id(passes[0]), []).append((event.start_ns(), event.end_ns()))
    for root in roots.values():
        for repetition in root.children:
            profile = by_repetition.get(id(repetition))
            for node in repetition.children if profile is not None else []:
                if node.name in PHASE_OF_RANGE:
                    idle = node.ns - union_ns(busy.get(id(node), []), node.start, node.end)
                    profile.stage(PHASE_OF_RANGE[node.name], HOST_OVERHEAD).add(idle, launches=0)


def union_ns(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """Length of the union of the intervals, clipped to [start, end]."""
    total, reach = 0, start
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reach), min(finish, end)
        if finish > begin:
            total += finish - begin
            reach = finish
    return total

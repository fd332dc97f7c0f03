"""Where a profiled repetition's time went, per stage, from torch.profiler's events.

The engine's kernel calls run inside ranges named by stage (gufo.kernels.profiling), its passes inside
`gufo.prefill` / `gufo.decode`, and `gufo profile` puts each timed repetition inside a range of its
own (`repetition_range`). On the CPU a stage's time is its ranges' time, less that of stage ranges
nested in them; the rest of a pass is `other`. On a GPU a stage's time is that of the device kernels
launched inside its ranges; kernels launched outside every stage are `copy` (memory copies and sets)
or `other`, kernels a CUDA graph replayed are `graph` (one launch runs them all, so no range tells
their stages apart), and the time the device sat idle during a pass is `host overhead`. Time inside a
repetition but outside the engine's passes (the runner's loop, sampling and drafting in speculative
tests) is `between_passes`.

Where a device kernel was launched from (`Launches.place`), first found of:
1. its linked host op (`linked_correlation_id`): the innermost torch op around the launch, by the
   external correlation id torch pushes for it. aten ops have one; `record_function` ranges push a
   *user* correlation id instead, which links nothing, so a Triton kernel launched straight from a
   stage range has none.
2. the API call that launched it, by the kernel's own correlation id (CUPTI's numbering, shared by a
   kernel and its launch call: `cudaLaunchKernel`, Triton's `cuLaunchKernelEx`, `cudaGraphLaunch`);
   the call's time on its host thread falls inside the ranges.
3. failing both, its start on the device, inside a pass (the passes end by reading their result
   back, so their kernels run within them): `other`, no stage.
The host op or call is then placed in the ranges by its thread and the middle of its time.

The events are read as Kineto gives them (`prof.profiler.kineto_results.events()`): building
torch's FunctionEvent tree costs seconds for what is read here in milliseconds.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gufo.kernels.profiling import PHASE_OF_RANGE, KernelRange

REPETITION_PREFIX = "gufo.repetition "
BETWEEN_PASSES, OTHER, COPY, GRAPH = "between_passes", "other", "copy", "graph"
HOST_OVERHEAD = "host overhead"
NO_PHASE = "-"  # the phase of the time between passes
HOST_OPS = ("cpu_op", "user_annotation")  # Kineto's activity types of torch ops and record_function ranges
LAUNCH_CALLS = ("cuda_runtime", "cuda_driver")  # runtime and driver API calls (HIP's too, on ROCm)
DEVICE_ACTIVITIES = {"kernel": OTHER, "gpu_memcpy": COPY, "gpu_memset": COPY}  # -> their stage outside ranges
# CUDA and HIP API calls: runtime (cudaLaunchKernel, hipLaunchKernel), driver (cuLaunchKernelEx)
API_CALL = re.compile(r"(cuda|hip)[A-Z]|cu[A-Z]")


def activity(event: Any) -> str:
    """Kineto's activity type of `event`. torch before 2.12 (2.11 on the GPU machines) has no
    `activity_type()`: there it is told from the device, `is_user_annotation()` (record_function
    ranges, on the host and their spans on the device) and the names: CUDA/HIP API calls, torch ops
    (`aten::mm`: a namespace) and ours; the host's other events are Kineto's own ("Activity Buffer
    Request", whose correlation ids are of another numbering); CUPTI names copies "Memcpy ..." and
    fills "Memset ..."."""
    if hasattr(event, "activity_type"):
        return event.activity_type()
    name, host = event.name(), event.device_type().name == "CPU"
    if event.is_user_annotation():
        return "user_annotation" if host else "gpu_user_annotation"
    if host:
        call = API_CALL.match(name)
        if call is not None:
            return "cuda_runtime" if call.group(1) else "cuda_driver"
        return "cpu_op" if "::" in name or ours(name) else "overhead"
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    return "gpu_memset" if name.startswith("Memset") else "kernel"


@dataclass(frozen=True, slots=True)
class Record:
    """A profiler event as the attribution reads it (read once: Kineto's methods are slow pybind calls)."""

    activity: str  # Kineto's activity type (`activity`)
    name: str
    thread: int  # torch's id of the host thread (a Kineto event takes that of the op it is linked to)
    start: int  # ns
    end: int
    correlation: int  # torch ops: torch's numbering; API calls and device events: CUPTI's (roctracer's)
    linked: int  # the correlation id of the host op a Kineto event is linked to (0: none)

    @property
    def middle(self) -> int:
        return (self.start + self.end) // 2


def records(events: Iterable[Any]) -> list[Record]:
    return [
        Record(
            activity(e),
            e.name(),
            e.start_thread_id(),
            e.start_ns(),
            e.end_ns(),
            e.correlation_id(),
            e.linked_correlation_id(),
        )
        for e in events
    ]


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


def our_ranges(events: list[Record]) -> dict[int, Node]:
    """The forest of our host ranges (their spans on the device are user annotations there, not here)."""
    return forest(
        (e.thread, e.name, e.start, e.end) for e in events if e.activity in HOST_OPS and ours(e.name)
    )


@dataclass
class Placement:
    """Where a device event was launched from: our ranges around it, outermost (its repetition) first."""

    how: str  # "op" (its linked host op), "launch" (its launch call) or "time" (its start on the device)
    chain: list[Node]
    call: Record | None  # the API call that launched it, when in the trace

    def stage(self, outside: str) -> str:
        """The stage of the innermost kernel range around the launch (`outside` if none)."""
        if self.call is not None and "GraphLaunch" in self.call.name:
            return GRAPH
        found = (KernelRange.parse(node.name) for node in reversed(self.chain))
        return next((kernel.stage for kernel in found if kernel is not None), outside)


class Launches:
    """Places device events in the timed repetitions' ranges (the module's docstring says how)."""

    def __init__(self, events: list[Record], roots: dict[int, Node], timed: set[int]):
        """`timed`: the ids of the timed repetitions' nodes among the roots' children."""
        self.ops = {e.correlation: e for e in events if e.activity in HOST_OPS}
        self.calls = {e.correlation: e for e in events if e.activity in LAUNCH_CALLS}
        self.roots, self.timed = roots, timed
        self.threads = [t for t, root in roots.items() if any(id(node) in timed for node in root.children)]

    def chain(self, thread: int | None, time: int) -> list[Node] | None:
        """Our ranges around `time` on `thread`, else on a thread that ran timed repetitions, when they
        are inside a timed repetition (a Kineto event not linked to an op takes the id of the thread
        that read the trace)."""
        for candidate in (thread, *self.threads):
            root = self.roots.get(candidate)
            chain = root.innermost(time) if root is not None else []
            if chain and id(chain[0]) in self.timed:
                return chain
        return None

    def place(self, event: Record) -> Placement | None:
        """Where `event` (on the device) was launched from; None outside the timed repetitions."""
        op = self.ops.get(event.linked) if event.linked else None
        call = self.calls.get(event.correlation) if event.correlation else None
        launcher = op or call
        if launcher is not None:  # linked: placed where its launcher ran, whatever the device's timing
            chain = self.chain(launcher.thread, launcher.middle)
            return None if chain is None else Placement("op" if op else "launch", chain, call)
        chain = self.chain(None, event.start)
        return None if chain is None else Placement("time", chain[:2], None)


def attribute(events: list[Any], device: bool) -> dict[int, list[RepetitionProfile]]:
    """Test sequence number -> its repetitions' profiles, from Kineto's events (`device`: time the GPU
    kernels, else the host ranges)."""
    read = records(events)
    roots = our_ranges(read)
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
        _device_kernels(read, Launches(read, roots, set(by_repetition)), by_repetition)
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
    events: list[Record], launches: Launches, by_repetition: dict[int, RepetitionProfile]
) -> None:
    """Each device kernel to the stage its launch ran in; each pass's idle time."""
    busy: dict[int, list[tuple[int, int]]] = {}  # id(pass range) -> its kernels' intervals
    for event in events:
        outside = DEVICE_ACTIVITIES.get(event.activity)
        placed = None if outside is None else launches.place(event)
        if placed is None or len(placed.chain) < 2 or placed.chain[1].name not in PHASE_OF_RANGE:
            continue  # outside the timed passes (a warm-up, a depth prefill, the runner's loop)
        repetition, pass_range = placed.chain[:2]
        profile, phase = by_repetition[id(repetition)], PHASE_OF_RANGE[pass_range.name]
        stage = placed.stage(outside)
        ns = event.end - event.start
        profile.stage(phase, stage).add(ns, launches=0)
        profile.kernel(phase, stage, event.name).add(ns)
        busy.setdefault(id(pass_range), []).append((event.start, event.end))
    for root in launches.roots.values():
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


def describe(events: list[Any], limit: int = 40) -> str:
    """What `gufo profile --debug-events` writes, to see why kernels went to no stage: the events per
    activity type, how the device events were placed, the raw fields of the first `limit` events, and
    those of the first `limit` device events of the first timed pass, each with where it was placed.
    An activity type read off a torch without `activity_type()` is marked `~` (told by `activity`)."""
    read = records(events)
    roots = our_ranges(read)
    timed = {id(n) for root in roots.values() for n in root.children if parse_repetition(n.name)}
    launches = Launches(read, roots, timed)
    origin = min((e.start for e in read), default=0)
    inferred = "" if events and hasattr(events[0], "activity_type") else "~"
    device = [i for i, e in enumerate(read) if e.activity in DEVICE_ACTIVITIES]
    placements = {i: launches.place(read[i]) for i in device}
    how = Counter(
        "outside the timed repetitions" if p is None else f"by {p.how}" for p in placements.values()
    )

    def fields(index: int) -> str:
        e = read[index]
        return (
            f"{inferred}{e.activity} | {events[index].device_type().name} | {e.name[:80]} | {e.thread} | "
            f"{(e.start - origin) / 1e3:.3f} | {(e.end - e.start) / 1e3:.3f} | {e.correlation} | {e.linked}"
        )

    columns = "activity | device | name | thread | start us | duration us | correlation | linked"
    lines = [
        f"{len(read)} events: " + ", ".join(f"{k} {n}" for k, n in Counter(e.activity for e in read).items()),
        f"{len(device)} device kernels, copies and sets, placed: "
        + ", ".join(f"{k} {n}" for k, n in how.items()),
        "",
        f"the first {limit} events (times from the first event's start)",
        columns,
        *(fields(i) for i in range(min(limit, len(read)))),
    ]
    passes = (n for root in roots.values() for r in root.children if id(r) in timed for n in r.children)
    first = next((n for n in passes if n.name in PHASE_OF_RANGE), None)
    if first is not None:
        lines += [
            "",
            f"device events starting in the first timed pass ({first.name})",
            f"{columns} || placed",
        ]
        for i in [i for i in device if first.start <= read[i].start <= first.end][:limit]:
            placement = placements[i]
            where = (
                "nowhere"
                if placement is None
                else (
                    f"by {placement.how}, call {placement.call.name if placement.call else '-'}, stage "
                    + placement.stage(DEVICE_ACTIVITIES[read[i].activity])
                )
            )
            lines.append(f"{fields(i)} || {where}")
    return "\n".join(lines) + "\n"

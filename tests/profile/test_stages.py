"""Stage attribution on hand-made profiler events: host ranges (the CPU) and device kernels placed where
they were launched from (the GPU path, which this CPU machine cannot trace for real). The GPU events are
shaped as torch 2.11 + Triton 3.6 gave them on an H200 (a probe there: a Triton kernel in a
record_function range, an aten op in one, a CUDA graph replay, the result read back): a Triton kernel
and its `cuLaunchKernelEx` share a (CUPTI) correlation id and are linked to no op; an aten op's kernel
and its `cudaLaunchKernel` are linked to the op; a graph's kernels share the id of its
`cudaGraphLaunch`; Kineto's own host events ("Lazy Function Loading") reuse numbers of torch's ops."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from gufo.kernels.profiling import DECODE_RANGE, KernelRange
from gufo.tools.profile.stages import activity, attribute, describe, repetition_range, union_ns

CUDA = "CUDA"


@dataclass
class Event211:
    """The methods of a Kineto event that the attribution reads, as torch 2.11 has them (no
    activity_type(): it tells only record_function ranges, on the host and on the device)."""

    label: str
    start: int
    end: int
    correlation: int = 0
    linked: int = 0
    activity: str = "cpu_op"
    device: str = "CPU"  # the name of its torch DeviceType
    thread: int = 1

    def name(self) -> str:
        return self.label

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.end

    def duration_ns(self) -> int:
        return self.end - self.start

    def device_type(self) -> SimpleNamespace:
        return SimpleNamespace(name=self.device)

    def start_thread_id(self) -> int:
        return self.thread

    def correlation_id(self) -> int:
        return self.correlation

    def linked_correlation_id(self) -> int:
        return self.linked

    def is_user_annotation(self) -> bool:
        return self.activity in ("user_annotation", "gpu_user_annotation")


class Event(Event211):
    """A Kineto event of torch 2.12 and later, which says its activity type."""

    def activity_type(self) -> str:
        return self.activity


LAYER = KernelRange("decode_layer", "fused", 300).name
OUTPUT = KernelRange("linear.Q8_0", "gemv", 100).name
NORM = KernelRange("norm", "rms", 0).name

# one timed repetition [0, 1000] holding one decode pass [100, 900]; a warm-up pass before it
HOST = [
    Event(DECODE_RANGE, -500, -100, correlation=1),  # the warm-up: outside every repetition
    Event(KernelRange("decode_layer", "fused", 300).name, -400, -200, correlation=2),
    Event(repetition_range(1, 0), 0, 1000, correlation=10),
    Event(DECODE_RANGE, 100, 900, correlation=11),
    Event(LAYER, 200, 500, correlation=12),
    Event(NORM, 600, 650, correlation=13),
    Event(OUTPUT, 700, 800, correlation=14),
    Event("aten::mm", 710, 715, correlation=15),
    Event(NORM, 720, 740, correlation=16),  # nested in the product's range: its own stage
    Event("aten::copy_", 850, 860, correlation=17),  # in the pass, outside every stage
]


def test_host_ranges_split_a_repetition_into_stages():
    (rep,) = attribute(HOST, device=False)[1]
    ns = {key: tally.ns for key, tally in rep.stages.items()}
    assert ns == {
        ("decode", "decode_layer"): 300,
        ("decode", "norm"): 50 + 20,
        ("decode", "linear.Q8_0"): 100 - 20,  # less the norm nested in it
        ("decode", "other"): 800 - 300 - 50 - 100,
        ("-", "between_passes"): 1000 - 800,
    }
    assert sum(ns.values()) == rep.ns == 1000
    assert rep.stages[("decode", "norm")].launches == 2
    assert rep.stages[("decode", "decode_layer")].bytes == 300
    assert rep.kernels[("decode", "linear.Q8_0", "gemv")].ns == 80


def test_device_kernels_go_to_the_stage_their_host_op_ran_in():
    device = [
        Event("gemv_q8_0", 720, 760, linked=15, activity="kernel", device=CUDA),  # via aten::mm
        Event("fused_layer", 300, 400, linked=12, activity="kernel", device=CUDA),  # launched by the range
        Event("Memcpy DtoH", 870, 880, linked=17, activity="gpu_memcpy", device=CUDA),
        Event("warm_up_kernel", -300, -250, linked=2, activity="kernel", device=CUDA),
        Event(LAYER, 300, 400, linked=12, activity="gpu_user_annotation", device=CUDA),  # not a kernel
        # a launch call whose (CUPTI) correlation id is the layer range's number: not a host op
        Event("cudaLaunchKernel", 50, 60, correlation=12, activity="cuda_runtime"),
    ]
    (rep,) = attribute(HOST + device, device=True)[1]
    ns = {key: tally.ns for key, tally in rep.stages.items() if tally.ns}
    assert ns == {
        ("decode", "decode_layer"): 100,
        ("decode", "linear.Q8_0"): 40,
        ("decode", "copy"): 10,
        ("decode", "host overhead"): 800 - (100 + 40 + 10),  # the pass with the device idle
        ("-", "between_passes"): 200,
    }
    assert rep.stages[("decode", "norm")].launches == 2  # the calls are counted, their kernels timed
    assert rep.kernels[("decode", "linear.Q8_0", "gemv_q8_0")].launches == 1
    assert rep.kernels[("decode", "copy", "Memcpy DtoH")].ns == 10


GEMV = KernelRange("linear.Q4_K", "triton-gemv", 1000).name


def triton_pass(event: type[Event211]) -> list[Event211]:
    """One timed repetition [0, 1000] with a decode pass [100, 900]: a Triton product, a norm through an
    aten op, a graph replay, a kernel linked to nothing, the logits read back; a warm-up kernel before."""
    annotation = {"activity": "user_annotation"}
    return [
        event(repetition_range(1, 0), 0, 1000, correlation=1, **annotation),
        event(DECODE_RANGE, 100, 900, correlation=2, **annotation),
        event(GEMV, 200, 300, correlation=3, **annotation),
        # Triton's launch: a driver call, linked to no op (ranges push user correlation ids), on the id of
        # the thread that read the trace
        event("cuLaunchKernelEx", 250, 260, correlation=40, activity="cuda_driver", thread=7),
        event("gemv_q4_k", 270, 370, correlation=40, activity="kernel", device=CUDA),
        event(GEMV, 270, 370, correlation=3, activity="gpu_user_annotation", device=CUDA),  # the range's span
        event(NORM, 400, 450, correlation=4, **annotation),
        event("aten::mul", 410, 440, correlation=5),
        event("cudaLaunchKernel", 420, 430, correlation=41, linked=5, activity="cuda_runtime"),
        event("vectorized_elementwise", 440, 460, correlation=41, linked=5, activity="kernel", device=CUDA),
        event(
            "Lazy Function Loading", 600, 610, correlation=5, activity="overhead"
        ),  # torch's number 5 again
        event("cudaGraphLaunch", 500, 510, correlation=42, activity="cuda_runtime"),
        event("k", 520, 560, correlation=42, activity="kernel", device=CUDA),
        event("vectorized_elementwise", 560, 600, correlation=42, activity="kernel", device=CUDA),
        event("orphan", 700, 730, correlation=99, activity="kernel", device=CUDA),  # no call, no op
        event("aten::copy_", 840, 880, correlation=6),
        event("cudaMemcpyAsync", 845, 848, correlation=43, linked=6, activity="cuda_runtime"),
        event(
            "Memcpy DtoH (Device -> Pageable)",
            850,
            860,
            correlation=43,
            linked=6,
            activity="gpu_memcpy",
            device=CUDA,
        ),
        event("warm_up", -300, -250, correlation=98, activity="kernel", device=CUDA),
    ]


@pytest.mark.parametrize("event", [Event211, Event], ids=["torch-2.11", "torch-2.13"])
def test_triton_graph_and_unlinked_kernels_go_where_they_were_launched(event):
    (rep,) = attribute(triton_pass(event), device=True)[1]
    ns = {key: tally.ns for key, tally in rep.stages.items() if tally.ns}
    assert ns == {
        ("decode", "linear.Q4_K"): 100,  # by its launch call, on the thread that ran the repetition
        ("decode", "norm"): 20,  # by its aten op (not Kineto's event of the same number)
        ("decode", "graph"): 40 + 40,
        ("decode", "other"): 30,  # by its start on the device, inside the pass
        ("decode", "copy"): 10,
        ("decode", "host overhead"): 800 - (100 + 20 + 80 + 30 + 10),
        ("-", "between_passes"): 1000 - 800,
    }
    assert (
        rep.stages[("decode", "linear.Q4_K")].launches == 1
        and rep.stages[("decode", "linear.Q4_K")].bytes == 1000
    )
    assert rep.kernels[("decode", "graph", "k")].launches == 1
    assert rep.kernels[("decode", "graph", "vectorized_elementwise")].ns == 40
    assert rep.kernels[("decode", "norm", "vectorized_elementwise")].ns == 20


@pytest.mark.parametrize(
    "name,device,annotation,expected",
    [
        ("cuLaunchKernelEx", "CPU", False, "cuda_driver"),
        ("cudaLaunchKernel", "CPU", False, "cuda_runtime"),
        ("hipModuleLaunchKernel", "CPU", False, "cuda_runtime"),
        ("aten::mm", "CPU", False, "cpu_op"),
        (GEMV, "CPU", False, "cpu_op"),
        ("Activity Buffer Request", "CPU", False, "overhead"),
        (GEMV, "CPU", True, "user_annotation"),
        (GEMV, CUDA, True, "gpu_user_annotation"),
        ("Memcpy DtoH (Device -> Pageable)", CUDA, False, "gpu_memcpy"),
        ("Memset (Device)", CUDA, False, "gpu_memset"),
        ("cudaGraphLaunch", CUDA, False, "kernel"),  # a kernel may have any name
    ],
)
def test_activity_of_a_torch_2_11_event_is_told_from_its_device_and_name(name, device, annotation, expected):
    kind = "user_annotation" if annotation else "cpu_op"
    assert activity(Event211(name, 0, 1, activity=kind, device=device)) == expected


def test_debug_events_say_how_each_device_event_was_placed():
    text = describe(triton_pass(Event211), limit=4)
    lines = text.splitlines()
    assert lines[1] == (
        "7 device kernels, copies and sets, placed: by launch 3, by op 2, by time 1, "
        "outside the timed repetitions 1"
    )
    first = lines[lines.index("the first 4 events (times from the first event's start)") + 2]
    assert first == f"~user_annotation | CPU | {repetition_range(1, 0)} | 1 | 0.300 | 1.000 | 1 | 0"
    gemv = next(line for line in lines if line.startswith("~kernel | CUDA | gemv_q4_k |"))
    assert gemv.endswith("|| by launch, call cuLaunchKernelEx, stage linear.Q4_K")
    section = "device events starting in the first timed pass (gufo.decode)"
    assert len(lines[lines.index(section) + 2 :]) == 4  # the limit
    everything = describe(triton_pass(Event211)).splitlines()
    assert len(everything[everything.index(section) + 2 :]) == 6  # the pass's device events: not the warm-up


H200_EVENTS = Path(__file__).parent / "fixtures" / "h200-torch2.11-triton3.6-events.json"


def test_events_recorded_on_the_h200_go_to_the_stages_of_the_workload():
    """Real Kineto events (scripts/kineto_events_probe.py on an H200: torch 2.11, Triton 3.6). Per timed
    repetition the probe's workload launches, in two passes: 2 x 2 Triton products, 2 x 2 Triton attentions,
    2 x 2 norms (an aten op), 2 adds outside the stages, 2 result copies; in its graph pass the graph's
    product and attention, and a copy."""
    recorded = json.loads(H200_EVENTS.read_text())["events"]
    events = [
        Event211(
            e["name"],
            e["start"],
            e["end"],
            correlation=e["correlation"],
            linked=e["linked"],
            activity="user_annotation" if e["user"] else "cpu_op",  # torch 2.11 tells only annotations
            device=e["device"],
            thread=e["thread"],
        )
        for e in recorded
    ]
    repetitions = attribute(events, device=True)[1]
    assert len(repetitions) == 2
    elementwise = "void at::native::vectorized_elementwise_kernel"
    copy = "Memcpy DtoH (Device -> Pageable)"
    spans = sorted((e["start"], e["end"]) for e in recorded if e["name"].startswith("gufo.repetition"))
    for rep, (start, end) in zip(repetitions, spans, strict=True):
        launches = Counter({key[1:]: tally.launches for key, tally in rep.kernels.items()})
        launches = Counter({(stage, kernel.split("<")[0]): n for (stage, kernel), n in launches.items()})
        assert launches == {
            ("linear.Q4_K", "gemv_k"): 4,
            ("attention", "attn_k"): 4,
            ("norm", elementwise): 4,
            ("other", elementwise): 2,
            ("copy", copy): 3,
            ("graph", "gemv_k"): 1,
            ("graph", "attn_k"): 1,
        }
        # every device event of the repetition went to a stage (none lost, none counted twice)
        on_device = [
            e for e in recorded if e["device"] == "CUDA" and not e["user"] and start <= e["start"] <= end
        ]
        placed = sum(
            t.ns for (phase, stage), t in rep.stages.items() if phase == "decode" and stage != "host overhead"
        )
        assert len(on_device) == sum(launches.values()) and placed == sum(
            e["end"] - e["start"] for e in on_device
        )


def test_union_of_busy_intervals_is_clipped_to_the_pass():
    assert union_ns([(0, 10), (5, 20), (30, 40), (35, 38)], 0, 100) == 20 + 10
    assert union_ns([(-5, 5), (95, 120)], 0, 100) == 5 + 5
    assert union_ns([], 0, 100) == 0


def test_range_names_round_trip_and_other_names_are_not_ranges():
    assert KernelRange.parse("linear.Q4_K|cpu-int8-avx2|1769472") == KernelRange(
        "linear.Q4_K", "cpu-int8-avx2", 1769472
    )
    assert KernelRange.parse(KernelRange("norm", "triton-rms-norm", 0).name).stage == "norm"
    for name in ("aten::mm", "gufo.decode", "linear|x", "bogus|k|1", "norm|k|x"):
        assert KernelRange.parse(name) is None

"""Stage attribution on hand-made profiler events: host ranges (the CPU) and device kernels linked to the
host ops that launched them (the GPU path, which this CPU machine cannot trace for real)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from gufo.kernels.profiling import DECODE_RANGE, KernelRange
from gufo.tools.profile.stages import attribute, repetition_range, union_ns

CUDA = "CUDA"


@dataclass
class Event:
    """The methods of a Kineto event that the attribution reads."""

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

"""Profiler ranges around kernel calls: only inside `profiling.ranges`, named by stage, with weight bytes."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from gufo.kernels import profiling, registry
from gufo.kernels.contracts import LINEAR, RMS_NORM
from gufo.kernels.cpu_int8 import CpuInt8Linear
from gufo.kernels.profiling import KernelRange, tensor_bytes
from gufo.options import ProfileOptions


def test_without_ranges_the_registry_hands_out_the_kernel_itself():
    _, plain = registry.lookup("cpu", RMS_NORM)
    assert registry.lookup("cpu", RMS_NORM)[1] is plain  # no wrapper: nothing is paid when not profiling
    with profiling.ranges(ProfileOptions()):
        _, wrapped = registry.lookup("cpu", RMS_NORM)
    assert wrapped is not plain and type(wrapped) is type(plain) and wrapped.name == plain.name
    assert registry.lookup("cpu", RMS_NORM)[1] is plain  # the context ended


def test_a_wrapped_call_runs_in_its_stage_range_with_the_same_result():
    x, weight = torch.randn(3, 8), torch.rand(8)
    _, plain = registry.lookup("cpu", RMS_NORM)
    with profiling.ranges(ProfileOptions()):
        _, wrapped = registry.lookup("cpu", RMS_NORM)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = wrapped.apply(x, weight, 1e-6)
    names = [e.name() for e in prof.profiler.kineto_results.events()]
    assert KernelRange("norm", plain.name, 0).name in names
    assert torch.equal(out, plain.apply(x, weight, 1e-6))


def test_a_linear_range_names_its_block_format_and_weight_bytes():
    from gguf import GGMLQuantizationType

    with profiling.ranges(ProfileOptions()):
        _, kernel = registry.lookup("cpu", LINEAR, GGMLQuantizationType.Q4_1)
    assert isinstance(kernel, CpuInt8Linear)  # the decode layer's check of its products still holds
    weight = Weight(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2), None)
    name = profiling._weight_names("linear.Q4_1", kernel.name)(None, weight)
    assert KernelRange.parse(name) == KernelRange("linear.Q4_1", "cpu-int8-avx2", 4 * 16 + 4 * 2 * 4)


def test_expert_products_run_in_their_stage_range_with_the_same_results():
    from gguf import GGMLQuantizationType

    from gufo.kernels.contracts import EXPERT_LINEAR
    from gufo.kernels.expert_groups import group_assignments

    weight, chosen = torch.randn(3, 4, 8), torch.tensor([2, 0])
    groups = group_assignments(torch.tensor([[0], [2], [2]]), 3, 16)  # counts 1, 0, 2
    x, rows = torch.randn(1, 8), torch.randn(3, 8)
    _, plain = registry.lookup("torch", EXPERT_LINEAR, GGMLQuantizationType.Q4_K)
    with profiling.ranges(ProfileOptions()):
        _, wrapped = registry.lookup("torch", EXPERT_LINEAR, GGMLQuantizationType.Q4_K)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        gathered, grouped = wrapped.gathered(x, weight, chosen), wrapped.grouped(rows, weight, groups)
    names = [e.name() for e in prof.profiler.kineto_results.events()]
    assert names.count(KernelRange("experts.Q4_K", plain.name, 0).name) == 2
    assert torch.equal(gathered, plain.gathered(x, weight, chosen))
    assert torch.equal(grouped, plain.grouped(rows, weight, groups))
    assert torch.allclose(gathered, torch.stack([weight[2] @ x[0], weight[0] @ x[0]]), atol=1e-5)
    assert torch.allclose(grouped, torch.cat([rows[:1] @ weight[0].T, rows[1:] @ weight[2].T]), atol=1e-5)


@dataclass
class Weight:
    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None


def test_tensor_bytes_counts_each_storage_once():
    shared = torch.zeros(10, dtype=torch.float32)
    assert tensor_bytes(Weight(shared, shared, torch.zeros(3, dtype=torch.int8))) == 40 + 3
    assert tensor_bytes((torch.zeros(2, 2), None, "text")) == 16


def test_the_debug_slowdown_sleeps_in_the_named_stage_only():
    x, weight = torch.randn(1, 8), torch.rand(8)
    with profiling.ranges(ProfileOptions(slow_stage="norm", slow_seconds=0.2)):
        _, slowed = registry.lookup("cpu", RMS_NORM)
        _, other = registry.lookup("cpu", LINEAR)  # the torch reference: another stage
    started = time.perf_counter()
    slowed.apply(x, weight, 1e-6)
    between = time.perf_counter()
    other.apply(x, torch.zeros(4, 8))
    assert between - started >= 0.2 > time.perf_counter() - between

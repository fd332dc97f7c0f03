"""Record how torch.profiler shows a gufo-like decode on a GPU, as the fields `gufo profile` reads, to JSON.

The workload mimics the engine under `gufo profile` without loading a model: decode passes (`gufo.decode`
ranges) whose kernel calls run in stage ranges (`stage|kernel|bytes`): a Triton product and a Triton
"attention" launched straight from their ranges (Triton launches through the driver API,
`cuLaunchKernelEx`), a norm through an aten op (`x.mul_`, the runtime's `cudaLaunchKernel`), an aten
op outside every stage and the result read back (a copy); one untimed pass, then two timed repetitions
(`gufo.repetition 1/R`) of two such passes and one pass replaying a CUDA graph of the two Triton
kernels. tests/profile/fixtures/h200-torch2.11-triton3.6-events.json was made by this script, and
tests/profile/test_stages.py attributes it.

    python scripts/kineto_events_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile, record_function

N = 1 << 20
BLOCK = 1024


@triton.jit
def gemv_k(p, n, BLOCK: tl.constexpr):  # noqa: N803 (Triton's constexpr style)
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(p + offsets, tl.load(p + offsets, mask=mask) * 2, mask=mask)


@triton.jit
def attn_k(p, n, BLOCK: tl.constexpr):  # noqa: N803
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(p + offsets, tl.load(p + offsets, mask=mask) + 1, mask=mask)


def main() -> None:
    x = torch.ones(N, device="cuda")

    def product() -> None:
        gemv_k[(N // BLOCK,)](x, N, BLOCK=BLOCK)

    def attention() -> None:
        attn_k[(N // BLOCK,)](x, N, BLOCK=BLOCK)

    def step() -> torch.Tensor:
        for _ in range(2):
            with record_function("linear.Q4_K|triton-gemv|4194304"):
                product()
            with record_function("attention|triton-attn|0"):
                attention()
            with record_function("norm|triton-rms|0"):
                x.mul_(0.5)
        x.add_(1)
        return x[:4].cpu()

    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        product()  # compiled before the capture
        attention()
        graph.capture_begin()
        product()
        attention()
        graph.capture_end()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        with record_function("gufo.decode"):  # untimed, as the warm-up is
            step()
        for repetition in range(2):
            with record_function(f"gufo.repetition 1/{repetition}"):
                for _ in range(2):
                    with record_function("gufo.decode"):
                        step()
                with record_function("gufo.decode"):
                    graph.replay()
                    x.cpu()
    events = [
        {
            "name": e.name(),
            "device": e.device_type().name,
            "thread": e.start_thread_id(),
            "start": e.start_ns(),
            "end": e.end_ns(),
            "correlation": e.correlation_id(),
            "linked": e.linked_correlation_id(),
            "user": e.is_user_annotation(),
        }
        for e in profiler.profiler.kineto_results.events()
    ]
    versions = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name()}
    with open(sys.argv[1], "w") as out:
        json.dump({**versions, "events": events}, out)


if __name__ == "__main__":
    main()

"""The Triton kernels of backend "cuda", built with the run's kernel options (gufo.kernels.catalog)."""

from __future__ import annotations

from gufo.kernels.registry import Registration
from gufo.kernels.triton import attention, attention_prefill, elementwise, experts, gemv, recurrent, routing
from gufo.kernels.triton.dependent_launch import DependentLaunch
from gufo.options import KernelOptions


def registrations(options: KernelOptions) -> tuple[Registration, ...]:
    launch = DependentLaunch(options.dependent_launch)
    return (
        gemv.registrations(options)
        + experts.registrations(options)
        + attention.registrations(launch)
        + attention_prefill.registrations(options)
        + elementwise.registrations(launch)
        + recurrent.registrations(launch, options)
        + routing.registrations(launch)
    )

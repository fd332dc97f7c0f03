"""Tile launches that fit a device's shared memory per block.

A tile kernel's loop keeps `num_stages` copies of its operand blocks in shared memory. The launches chosen
on an H100 (227 KiB a block) can ask for more than a consumer card has (99 KiB on sm_86 and sm_89): the
fixed-tile prefill product 144 KiB in 3 stages, its attention 128 KiB, the grouped expert products up to
146 KiB. Triton refuses such a launch (OutOfResources, before anything runs), so `launch` tries fewer
stages. Fewer stages issue the same loads later and do the same arithmetic in the same order, so a row's
numbers do not change with them; the count kept is a function of the kernel, its settings and the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from triton.runtime.errors import OutOfResources

# (kernel, its settings, device) -> the most stages that launched there
_STAGES: dict[tuple[Any, ...], int] = {}


def launch(
    kernel: Any, grid: tuple[int, ...] | Callable, *args: Any, num_stages: int, **settings: Any
) -> None:
    """kernel[grid](*args, num_stages=..., **settings) with `num_stages`, or with as many fewer (at least
    one) as the current device's shared memory per block takes."""
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    key = (kernel, tuple(sorted(settings.items())), device)
    stages = _STAGES.get(key, num_stages)
    while True:
        try:
            kernel[grid](*args, num_stages=stages, **settings)
        except OutOfResources:
            if stages == 1:
                raise
            stages -= 1
            continue
        _STAGES[key] = stages
        return

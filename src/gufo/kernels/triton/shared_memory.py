"""Pipeline stages that fit a device's shared memory per block.

A tile kernel's loop keeps `num_stages` copies of its operand blocks in shared memory. The launches chosen
on an H100 (227 KiB a block) can ask for more than a consumer card has (99 KiB on sm_86 and sm_89), where
Triton refuses the launch. Fewer stages issue the same loads later and do the same arithmetic in the same
order, so a row's numbers do not change with them; the count is a function of the device alone.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _block_limit(device_index: int) -> int:
    """Shared memory bytes a block may use on the device (Triton's own limit, the one its launch checks)."""
    from triton.runtime import driver

    return driver.active.utils.get_device_properties(device_index)["max_shared_mem"]


def fitting_stages(device: torch.device, stages: int, fixed: int, per_stage: int) -> int:
    """`stages`, or fewer (at least 1) so that `fixed` + stages x `per_stage` bytes fit the device's shared
    memory per block. Devices without that limit (meta tensors of the offline compiles, the interpreter's
    CPU tensors) keep `stages`."""
    if device.type != "cuda":
        return stages
    index = torch.cuda.current_device() if device.index is None else device.index
    return max(1, min(stages, (_block_limit(index) - fixed) // per_stage))

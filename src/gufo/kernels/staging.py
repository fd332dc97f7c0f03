"""Host values on their way to a device with nothing waiting for them: a copy from pageable memory
first waits for all the work queued on the device before it, one from pinned memory does not."""

from __future__ import annotations

import torch


def staged(values: list, device: torch.device) -> torch.Tensor:
    """`values` as a host tensor to copy to `device` with `non_blocking=True`: in pinned memory where the
    device is not the CPU (torch keeps a pinned block until the copies from it have run)."""
    host = torch.tensor(values)
    return host if device.type == "cpu" else host.pin_memory()

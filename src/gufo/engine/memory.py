"""Peak memory of this process, for per-rank reports."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_bytes(device: str) -> int:
    """torch's allocator peak on a GPU; the peak resident set size of the process on the CPU."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(torch.device(device)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB, macOS bytes

"""Peak memory of this process, for per-rank reports, and what the KV cache takes by default."""

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


# the share of a GPU's free memory (after the weights load) the KV cache may take by default: the rest is
# for captured graphs, activations and the products' scratch
KV_SHARE_OF_FREE = 0.8


def default_kv_memory(device: str) -> int | None:
    """Bytes the KV cache's pages may take when not asked: on a GPU KV_SHARE_OF_FREE of its free memory;
    None (every slot's whole context) on the CPU."""
    if torch.device(device).type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return int(free * KV_SHARE_OF_FREE)

"""What a benchmark row says about where it ran: build, versions, hardware and a privacy-safe fingerprint.

The fingerprint hashes hardware facts only (CPU and GPU model, core count, memory size): no hostnames,
user names or paths, so rows can be shared and still grouped by machine.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
from pathlib import Path

import torch

from gufo import __version__


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> int:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        return 0


def gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def device_name(device: str) -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return cpu_model()


def backend_label(device: str) -> str:
    """llama-bench's `backends` column: CPU, or CUDA (ROCm builds of torch also report device type cuda)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return "ROCm" if torch.version.hip else "CUDA"
    return dev.type.upper()


def fingerprint() -> str:
    facts = "|".join([cpu_model(), str(os.cpu_count()), str(memory_gib()), *gpu_names()])
    return hashlib.sha256(facts.encode()).hexdigest()[:16]


@functools.cache
def git_revision() -> str:
    """Short commit of the gufo checkout this code runs from, `-dirty` when tracked files changed."""
    root = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        return ""
    return triton.__version__


def build_info() -> dict[str, object]:
    """Fields shared by every row of one run."""
    return {
        "build_commit": git_revision(),
        "build_number": 0,
        "gufo_version": __version__,
        "torch_version": torch.__version__,
        "triton_version": triton_version(),
        "cpu_info": cpu_model(),
        "gpu_info": ", ".join(gpu_names()),
        "machine_fingerprint": fingerprint(),
    }

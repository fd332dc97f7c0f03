"""llama.cpp's habits: its flags that mean something here, with that meaning (`-ngl`, `-fa`, `-ctk`/`-ctv`,
`--no-mmap`, `--mlock`); what gufo cannot do is refused by name, in one line."""

from __future__ import annotations

import argparse
import logging
import os

from gufo.errors import BadInputError

log = logging.getLogger(__name__)

# the KV cache's element type on each kind of device (gufo.kernels.backends.cache_dtype)
CACHE_TYPES = ("f32", "f16")
FLASH_ATTENTION = ("on", "off", "auto", "1", "0")


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        default=None,
        help="where to run: cpu (the default, unless -ngl asks for a GPU) or cuda[:N]",
    )
    parser.add_argument(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="gpu_layers",
        type=gpu_layers,
        default=None,
        metavar="N",
        help="llama.cpp's offload count, as a device choice: N > 0 or all runs every layer on the GPU "
        "(--device cuda), 0 on the CPU, auto on the GPU when torch sees one; gufo never splits a model "
        "between the two",
    )


def gpu_layers(text: str) -> int | str:
    if text in ("all", "auto"):
        return text
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a layer count, all or auto, got {text!r}")


def add_llama_compat_flags(parser: argparse.ArgumentParser, mlock: bool = True) -> None:
    """Flags llama.cpp users bring along; each says here what it does in gufo (`mlock`: with --mlock,
    for the commands that load one model and then work)."""
    group = parser.add_argument_group("llama.cpp flags (accepted with these meanings)")
    group.add_argument(
        "-fa",
        "--flash-attn",
        nargs="?",
        const="on",
        choices=FLASH_ATTENTION,
        default=None,
        metavar="on|auto|off",
        help="flash attention: what gufo always does (fused attention kernels on GPUs and the CPU), so on "
        "and auto change nothing; off is refused",
    )
    group.add_argument(
        "-ctk",
        "--cache-type-k",
        default=None,
        metavar="TYPE",
        help="KV cache type of K: f32 or f16 are accepted and change nothing (the cache is f32 on the CPU, "
        "f16 on GPUs); quantized types are refused (gufo has no quantized KV cache)",
    )
    group.add_argument("-ctv", "--cache-type-v", default=None, metavar="TYPE", help="the same for V")
    group.add_argument(
        "--no-mmap",
        action="store_true",
        help="read the model file into memory instead of memory-mapping it (the CPU looks embedding rows up "
        "in the file's pages)",
    )
    if not mlock:
        return
    group.add_argument(
        "--mlock",
        action="store_true",
        help="once the model has loaded, lock the process's memory in RAM (no swapping); a warning when the "
        "system refuses (RLIMIT_MEMLOCK)",
    )


def device(args: argparse.Namespace) -> str:
    """--device, or the GPU that -ngl N > 0 asks for; a contradiction between the two is refused."""
    layers = args.gpu_layers
    if layers == "auto":
        import torch

        layers = "all" if torch.cuda.is_available() else 0
    if args.device is None:
        return "cuda" if layers else "cpu"
    if layers is not None and bool(layers) != args.device.startswith("cuda"):
        raise BadInputError(f"-ngl {args.gpu_layers} contradicts --device {args.device}")
    return args.device


def check_llama_compat(args: argparse.Namespace) -> None:
    """Refuse, naming the flag, what gufo cannot do: attention without fusion, a quantized KV cache."""
    if args.flash_attn in ("off", "0"):
        raise BadInputError(f"-fa {args.flash_attn}: gufo's attention is always fused; it has no other path")
    for flag, value in (("-ctk", args.cache_type_k), ("-ctv", args.cache_type_v)):
        if value is not None and value.lower() not in CACHE_TYPES:
            raise BadInputError(
                f"{flag} {value}: gufo has no quantized KV cache (its cache is f32 on the CPU, f16 on GPUs)"
            )


MCL_CURRENT = 1  # <sys/mman.h>: lock the pages mapped now


def lock_memory() -> None:
    """mlockall(MCL_CURRENT), as llama.cpp's --mlock; a warning line when it is refused."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.mlockall(MCL_CURRENT) != 0:
        err = ctypes.get_errno()
        log.warning("--mlock: the system refused to lock the model in RAM: %s", os.strerror(err))

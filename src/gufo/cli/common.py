"""Flags shared by several commands, and turning them into library objects."""

from __future__ import annotations

import argparse
import logging
import os
import re
from dataclasses import replace

from gufo.cli.compat import add_device_flags, add_llama_compat_flags, check_llama_compat, device, lock_memory
from gufo.cli.progress import add_progress_flags, load_reported
from gufo.engine.params import DRAFT_MAX, SPECULATIVE_MODES, SamplingParams, SpeculativeParams
from gufo.errors import BadInputError
from gufo.gguf.aliases import ALIASES, DEFAULT_MODEL
from gufo.options import (
    DEFAULT_BATCH,
    DEFAULT_CONTEXT,
    DEFAULT_INT8_MIN_WEIGHTS,
    DELTA_RULE_PREFILLS,
    DEPENDENT_LAUNCH_ENV,
    INT8_LIMIT_ENV,
    PREFILL_PRODUCTS,
    ROW_PRODUCTS,
    KernelOptions,
    RunOptions,
)

log = logging.getLogger(__name__)


def int_in(minimum: int, wording: str, maximum: int | None = None):
    """An argparse type: whole numbers from `minimum` (to `maximum`), else `expected {wording}`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {wording}, got {text!r}")
        return value

    return parse


positive_int = int_in(1, "a positive integer")
non_negative_int = int_in(0, "an integer >= 0")
port_number = int_in(0, "a TCP port number 0-65535", 65535)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def add_model_flag(parser: argparse.ArgumentParser, required: bool = False) -> None:
    aliases = ", ".join(sorted(ALIASES))
    parser.add_argument(
        "-m",
        "--model",
        required=required,
        default=None,
        help=f"GGUF file path or alias ({aliases}); default: {DEFAULT_MODEL}"
        if not required
        else f"GGUF file path or alias ({aliases})",
    )


def add_engine_flags(parser: argparse.ArgumentParser, batch_help: str | None = None) -> None:
    """The flags every engine command takes; `batch_help` replaces -b's help and makes its default None
    (a command that picks the batch size itself when -b is not given)."""
    add_model_flag(parser)
    add_device_flags(parser)
    parser.add_argument(
        "-c",
        "--ctx-size",
        "--context",
        type=positive_int,
        default=DEFAULT_CONTEXT,
        help=f"context size in tokens (KV cache length), capped at the model's (default {DEFAULT_CONTEXT})",
    )
    parser.add_argument(
        "-b",
        "--batch-size",
        type=positive_int,
        default=DEFAULT_BATCH if batch_help is None else None,
        help=batch_help
        or f"prompt tokens per forward pass during prefill (default {DEFAULT_BATCH}); on a GPU, chunks "
        "replay captured graphs (padded to the next power of two from 16, or to this many tokens)",
    )
    parser.add_argument(
        "-t",
        "--threads",
        type=positive_int,
        default=None,
        help="CPU threads (default: torch's, the number of cores; idle threads sleep rather than spin, "
        "unless OMP_WAIT_POLICY says otherwise, so the default holds up on a busy machine)",
    )
    add_eager_flag(parser)
    add_progress_flags(parser)
    add_llama_compat_flags(parser)


TENSOR_PARALLEL_HELP = (
    "shard the model over N processes (Megatron-style: attention by KV-head group, KV heads replicated "
    "when fewer than N; FFN; vocabulary). "
    "Launch with torchrun, one process per GPU with --device cuda (NCCL/RCCL) or on the CPU (gloo): "
    "python -m torch.distributed.run --standalone --nproc-per-node N -m gufo.cli.main COMMAND -tp N ...; "
    "several hosts: --nnodes H --node-rank I --rdzv-backend c10d --rdzv-endpoint HOST:PORT with "
    "--nproc-per-node GPUs per host (N = H x GPUs). Rank 0 prints "
    "and serves; a model whose heads or quantized blocks do not split N ways is refused (default 1)"
)


def add_tensor_parallel_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-tp", "--tensor-parallel", type=positive_int, default=1, metavar="N", help=TENSOR_PARALLEL_HELP
    )


def add_eager_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--eager",
        action="store_true",
        help="GPU: run decode steps and prefill chunks op by op instead of replaying captured CUDA graphs "
        "(debugging)",
    )
    parser.add_argument(
        "--int8-min-weights",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="GPU: the smallest matrix (rows x columns) whose products quantize float32 activations to "
        "int8 (formats with int8 kernels); 0: every such matrix "
        f"(default: ${INT8_LIMIT_ENV}, else {DEFAULT_INT8_MIN_WEIGHTS})",
    )
    parser.add_argument(
        "--dependent-launch",
        choices=("on", "off"),
        default=None,
        help="GPU (NVIDIA sm_90+): launch each kernel so its prologue overlaps the previous kernel's tail "
        f"(default: ${DEPENDENT_LAUNCH_ENV} as 1/0, else on)",
    )
    parser.add_argument(
        "--row-products",
        choices=ROW_PRODUCTS,
        default="vector",
        help="GPU (NVIDIA): how decode products run: vector (Q4_K, Q6_K, Q8_0 and the other int8 formats: "
        "4-way integer dot products per row, up to 16 rows a product), tensor (int8 rows of Q4_K, Q6_K and "
        "Q8_0 weights on tensor-core tiles of 16 rows, up to 64 rows a product) or f16 (every weight "
        "dequantized to float16 once at load, about 3.5x a Q4_K_M file's bytes of GPU memory, and "
        "multiplied as one cuBLAS product of a fixed 64 rows, up to 64 rows a product: for serving many "
        "requests where memory allows). With tensor (where every weight takes it) and f16, a server's "
        "steps of up to 64 requests are one graph replay. Every decode step of a run, one row or many, "
        "takes the same route, so greedy output never depends on how many requests share a step "
        "(default vector)",
    )
    parser.add_argument(
        "--prefill-products",
        choices=PREFILL_PRODUCTS,
        default="cublas",
        help="GPU (NVIDIA): how prefill products (more rows than the decode routes take) run: cublas (the "
        "weights dequantized to float16, then one cuBLAS product, which picks its kernel by the shape: the "
        "fastest for one prompt) or tiles (gufo's fixed tensor-core tiles, and an attention whose blocks of "
        "keys start at fixed positions: each prompt token's numbers the same whatever rows share the "
        "pass and whatever chunk it comes in, so that a server's prompts can share prefill passes and "
        "reuse a cached prefix of any length); auto: "
        "tiles for the models whose prompts can share passes (llama, qwen3, gemma3: every layer dense "
        "attention), cublas for the others (default cublas; serve: auto)",
    )
    parser.add_argument(
        "--delta-rule-prefill",
        choices=DELTA_RULE_PREFILLS,
        default=None,
        help="GPU: how the Gated DeltaNet layers (qwen35, qwen35moe, qwen3next) run several tokens of one "
        "sequence: fla (fla-core's chunked Triton kernels, pip install 'gufo[cuda]'), torch (gufo's "
        "chunked torch form) or recurrent (gufo's Triton decode step over the tokens in one launch: "
        "prefill's states bit for bit decode's, whatever the chunking); decode steps run gufo's "
        "Triton step either way (default recurrent)",
    )


def warn_about_threads(counts: list[int]) -> None:
    """One warning line when a thread count exceeds the cores this process may run on: the threads
    then take turns on the cores, and every barrier waits for the slowest."""
    cores = len(os.sched_getaffinity(0))
    over = max(counts, default=0)
    if over > cores:
        log.warning(
            "-t %d exceeds the %d CPU cores this process may use: expect it to run slower", over, cores
        )


def run_options(args: argparse.Namespace, threads: int | None = None) -> RunOptions:
    """RunOptions from the flags, the environment variables standing in for flags not given."""
    kernels = replace(
        KernelOptions.from_environment(os.environ),
        row_products=args.row_products,
        prefill_products=args.prefill_products,
    )
    if args.int8_min_weights is not None:
        kernels = replace(kernels, int8_min_weights=args.int8_min_weights)
    if args.dependent_launch is not None:
        kernels = replace(kernels, dependent_launch=args.dependent_launch == "on")
    if args.delta_rule_prefill is not None:
        kernels = replace(kernels, delta_rule_prefill=args.delta_rule_prefill)
    check_llama_compat(args)
    return RunOptions(
        device=device(args), graphs=not args.eager, threads=threads, kernels=kernels, mmap=not args.no_mmap
    )


# (flag, SamplingParams field, parser, help) for the flags that map one-to-one onto a field.
SAMPLING_FLAGS = (
    ("--temp", "temperature", float, "temperature; 0 = greedy argmax, ties to the lowest id"),
    ("--top-k", "top_k", non_negative_int, "keep the K most likely tokens; 0 = off"),
    ("--top-p", "top_p", float, "nucleus sampling threshold; 1.0 = off"),
    ("--min-p", "min_p", float, "drop tokens below min-p times the top probability; 0 = off"),
    ("--repeat-penalty", "repeat_penalty", float, "penalty for recently seen tokens; 1.0 = off"),
    ("--repeat-last-n", "repeat_last_n", int, "how many recent tokens the penalty sees; -1 = all"),
)


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    defaults = SamplingParams()
    group = parser.add_argument_group("sampling (llama.cpp order: penalty, top-k, top-p, min-p, temperature)")
    for flag, field, parse, text in SAMPLING_FLAGS:
        default = getattr(defaults, field)
        group.add_argument(flag, dest=field, type=parse, default=default, help=f"{text} (default {default})")
    group.add_argument("-s", "--seed", type=int, default=None, help="random seed (default: random)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    if args.temperature < 0:
        raise BadInputError(f"--temp must be >= 0, got {args.temperature}")
    if not 0.0 < args.top_p <= 1.0:
        raise BadInputError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        raise BadInputError(f"--min-p must be in [0, 1], got {args.min_p}")
    if args.repeat_penalty <= 0:
        raise BadInputError(f"--repeat-penalty must be > 0, got {args.repeat_penalty}")
    fields = {field: getattr(args, field) for _, field, _, _ in SAMPLING_FLAGS}
    return SamplingParams(seed=args.seed, **fields)


def add_speculative_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    defaults = SpeculativeParams()
    group = parser.add_argument_group("speculative decoding (greedy output identical to plain decoding)")
    group.add_argument(
        "--speculative",
        choices=SPECULATIVE_MODES,
        required=required,
        default=None,
        help="draft tokens by prompt lookup (ngram), with a smaller model (draft, needs --draft-model) or "
        "with the model's own multi-token-prediction block (mtp: qwen35, qwen35moe and qwen3next files "
        "converted with it; on GPUs with --eager) and verify them in one pass of the model"
        + ("" if required else " (default: off)"),
    )
    group.add_argument(
        "--draft-model",
        default=None,
        metavar="MODEL",
        help="GGUF path or alias of the draft model; it must have the same vocabulary",
    )
    group.add_argument(
        "--draft-max",
        type=positive_int,
        default=None,
        help="most tokens drafted per step (default "
        + ", ".join(f"{count} with {mode}" for mode, count in DRAFT_MAX.items())
        + ")",
    )
    group.add_argument(
        "--draft-min",
        type=non_negative_int,
        default=defaults.draft_min,
        help=f"shorter drafts are not verified (default {defaults.draft_min})",
    )
    group.add_argument(
        "--ngram-min",
        type=positive_int,
        default=defaults.ngram_min,
        help=f"ngram: shortest context suffix looked up (default {defaults.ngram_min})",
    )


def speculative_params(args: argparse.Namespace) -> SpeculativeParams | None:
    """SpeculativeParams from the flags, or None without --speculative."""
    if args.speculative is None:
        if args.draft_model is not None:
            raise BadInputError("--draft-model needs --speculative draft")
        return None
    if (args.speculative == "draft") != (args.draft_model is not None):
        raise BadInputError("--draft-model MODEL goes with --speculative draft, and only with it")
    return SpeculativeParams(args.speculative, args.draft_max, args.draft_min, args.ngram_min)


NOISE_ENV = "GUFO_DEBUG_PREFILL_NOISE"


def parse_noise() -> tuple[int, float] | None:
    """The debug hook {NOISE_ENV}=LAYER:STD (see quality.validate_prefill.add_prefill_noise), if set."""
    text = os.environ.get(NOISE_ENV)
    if not text:
        return None
    try:
        layer, std = text.split(":")
        return int(layer), float(std)
    except ValueError:
        raise BadInputError(f"{NOISE_ENV}: expected LAYER:STD, got {text!r}") from None


def make_engine(args: argparse.Namespace, n_slots: int = 1, kv_memory: int | None = None):
    """The engine the flags ask for (this process's rank of it with --tensor-parallel N); `kv_memory`:
    bytes of its KV cache (`Engine`'s default when None)."""
    from gufo.parallel.engine import open_engine

    if args.threads is not None:
        warn_about_threads([args.threads])
    options = run_options(args, args.threads)
    with load_reported(args, args.model or DEFAULT_MODEL) as progress:
        engine = open_engine(
            args.model,
            options,
            getattr(args, "tensor_parallel", 1),
            context=args.ctx_size,
            n_slots=n_slots,
            batch_size=args.batch_size,
            progress=progress,
            kv_memory=kv_memory,
        )
    if args.mlock:
        lock_memory()
    return engine


_SIZE_UNITS = {"K": 1000, "M": 1000**2, "G": 1000**3}


def byte_size(text: str) -> int:
    """`500M` -> 500_000_000 bytes (decimal units, as llama.cpp's gguf-split counts)."""
    match = re.fullmatch(r"([0-9]+)([KMG])", text.strip())
    if match is None or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(f"expected a size like 500M or 2G (units K, M, G), got {text!r}")
    return int(match[1]) * _SIZE_UNITS[match[2]]


def parse_id_list(text: str, flag: str) -> list[int]:
    """Token ids separated by commas and/or whitespace, optionally in [brackets]."""
    parts = [part for part in re.split(r"[\s,]+", text.strip().strip("[]")) if part]
    bad = next((part for part in parts if not part.lstrip("-").isdigit()), None)
    if bad is not None:
        raise BadInputError(f"{flag}: expected comma-separated token ids, got {bad[:40]!r}")
    ids = [int(part) for part in parts]
    if not ids:
        raise BadInputError(f"{flag}: no token ids given")
    return ids

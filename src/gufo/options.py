"""Run options: the settings that pick routes and kernels, built once (by the CLI, from flags with
environment variables as defaults), handed down explicitly and recorded in every bench row.

Nothing in gufo reads these variables at import; `from_environment` is called by whoever builds the
options, with the mapping it chooses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from importlib.util import find_spec

from gufo.errors import BadInputError

INT8_LIMIT_ENV = "GUFO_INT8_MIN_WEIGHTS"
DEPENDENT_LAUNCH_ENV = "GUFO_DEPENDENT_LAUNCH"
# docs/decisions.md, "int8 activations only for large matrices"
DEFAULT_INT8_MIN_WEIGHTS = 2**21
# how the GPU's decode products of int8 activation rows run (KernelOptions.row_products)
ROW_PRODUCTS = ("vector", "tensor", "f16")
PREFILL_PRODUCTS = ("cublas", "tiles", "auto")
# how the GPU's gated delta rule runs several tokens of one sequence (KernelOptions.delta_rule_prefill)
DELTA_RULE_PREFILLS = ("fla", "torch", "recurrent")
FLA_MISSING = (
    "delta rule prefill fla: fla-core {}; pip install 'gufo[cuda]' or pass --delta-rule-prefill recurrent"
)
DEFAULT_CONTEXT = 4096  # tokens of KV cache, capped at the model's context length
DEFAULT_BATCH = 2048  # prompt tokens per prefill pass
POOLINGS = ("mean", "last")  # how an embedding pools its tokens' hidden states (`Engine.embed`)


def fla_installed() -> bool:
    """Whether the fla-core package is there (found, not imported: importing it loads its models too)."""
    return find_spec("fla") is not None


# prefill's delta rule as decode's step, bit for bit whatever the chunking; measured faster end to end
# than fla-core's chunked kernels (docs/decisions.md, "Gated delta rule prefill")
DEFAULT_DELTA_RULE_PREFILL = "recurrent"


@dataclass(frozen=True)
class KernelOptions:
    """What the GPU kernels are built with (the CPU kernels take none of these)."""

    # smallest matrix (N * K weights) whose float32 activations are quantized to int8 for its
    # products (formats with int8 kernels); 0: every such matrix
    int8_min_weights: int = DEFAULT_INT8_MIN_WEIGHTS
    # programmatic dependent launch on sm_90+ (each kernel's prologue overlaps the previous one's tail)
    dependent_launch: bool = True
    # the products of 1..64 int8 activation rows of Q4_K, Q6_K and Q8_0 weights: "vector" (gemv_int8, up
    # to 16 rows) or "tensor" (rows_int8: tensor-core tiles of 16 rows, every row count of a run alike);
    # "f16": every weight dequantized to float16 at load, 1..64 float rows in one cuBLAS product of 64
    # rows (rows_half), every row count of a run alike
    row_products: str = "vector"
    # the products of more than the skinny routes' rows (prefill): "cublas" (dequantized weights times the
    # activations in one cuBLAS product) or "tiles" (gufo's fixed tensor-core tiles, prefill_tiles.py: each
    # row's numbers the same at any row count, where cuBLAS picks its kernel by the shape); "auto": the
    # tiles for the architectures whose prompts share prefill passes, else cuBLAS (the Engine decides
    # from the file: gufo.models.registry.PACKING_ARCHITECTURES)
    prefill_products: str = "cublas"
    # how the gated delta rule runs a prompt's tokens: "recurrent" (gufo's Triton decode step over them in
    # one launch), or a chunked form, "fla" (fla-core's Triton kernels) or "torch" (gufo.kernels.
    # delta_rule); decode steps run gufo's Triton step either way
    delta_rule_prefill: str = DEFAULT_DELTA_RULE_PREFILL

    def __post_init__(self) -> None:
        if self.delta_rule_prefill not in DELTA_RULE_PREFILLS:
            raise BadInputError(
                f"delta rule prefill: expected one of {', '.join(DELTA_RULE_PREFILLS)}, "
                f"got {self.delta_rule_prefill!r}"
            )
        if self.delta_rule_prefill == "fla" and not fla_installed():
            raise BadInputError(FLA_MISSING.format("is not installed"))
        if self.prefill_products not in PREFILL_PRODUCTS:
            choices = ", ".join(PREFILL_PRODUCTS)
            raise BadInputError(f"prefill products: expected one of {choices}, got {self.prefill_products!r}")
        if self.row_products not in ROW_PRODUCTS:
            raise BadInputError(
                f"row products: expected one of {', '.join(ROW_PRODUCTS)}, got {self.row_products!r}"
            )
        if isinstance(self.int8_min_weights, bool) or not isinstance(self.int8_min_weights, int):
            raise BadInputError(
                f"int8 limit: expected a whole number of weights, got {self.int8_min_weights!r}"
            )
        if self.int8_min_weights < 0:
            raise BadInputError(f"int8 limit: expected 0 or more weights, got {self.int8_min_weights}")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> KernelOptions:
        """The defaults, overridden by GUFO_INT8_MIN_WEIGHTS and GUFO_DEPENDENT_LAUNCH (0 turns it off)."""
        options = cls()
        text = environ.get(INT8_LIMIT_ENV)
        if text is not None:
            if not text.strip().isdigit():
                raise BadInputError(
                    f"{INT8_LIMIT_ENV}={text!r}: expected a whole number of weights (0: int8 activations for "
                    "every matrix of the formats that have int8 kernels)"
                )
            options = replace(options, int8_min_weights=int(text))
        launch = environ.get(DEPENDENT_LAUNCH_ENV)
        if launch is not None:
            if launch.strip() not in ("0", "1"):
                raise BadInputError(f"{DEPENDENT_LAUNCH_ENV}={launch!r}: expected 0 or 1")
            options = replace(options, dependent_launch=launch.strip() == "1")
        return options


# `gufo profile`'s stage of each registry op, by op name (a linear's adds its block format: linear.Q4_K)
STAGE_OF_OP = {
    "linear": "linear",
    "expert_linear": "experts",
    "rms_norm": "norm",
    "add_rms_norm": "norm",
    "gated_rms_norm": "norm",
    "rms_norm_rope": "norm_rope",
    "rope": "rope",
    "attention_heads": "attention",
    "attention_prefill": "attention",
    "attention_decode": "attention",
    "gated_act": "activation",
    "causal_conv1d": "conv",
    "gated_delta_rule": "delta_rule",
    "decode_layer": "decode_layer",
}


@dataclass(frozen=True)
class ProfileOptions:
    """Kernel calls inside torch.profiler ranges named by stage (`gufo profile`; gufo.kernels.profiling)."""

    # debugging: sleep this long inside every launch of this stage, so a profile comparison must flag it
    slow_stage: str | None = None
    slow_seconds: float = 0.002


@dataclass(frozen=True)
class RunOptions:
    """How an engine runs a model: the device, graph capture, CPU threads, the kernels' options, and
    whether its kernel calls are wrapped in profiler ranges (None: the kernels themselves, no wrapper)."""

    device: str = "cpu"
    graphs: bool = True  # GPU decode steps and full prefill chunks replay captured CUDA graphs
    threads: int | None = None  # CPU threads (torch's default when None)
    kernels: KernelOptions = field(default_factory=KernelOptions)
    mmap: bool = True  # the GGUF file is memory-mapped (False: read into memory, llama.cpp's --no-mmap)
    profile: ProfileOptions | None = None

    def record(self) -> dict[str, object]:
        """The options as a flat JSON-ready dict (bench rows carry it next to `routes`)."""
        flat = asdict(self)
        flat.update(flat.pop("kernels"))
        if self.profile is None:  # bench rows keep their fields
            del flat["profile"]
        return flat

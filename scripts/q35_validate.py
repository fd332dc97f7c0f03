"""Which numerics make a hybrid Qwen file's prefill and decode disagree: `--validate-prefill` per variant.

Each variant builds a fresh engine, runs the `--validate-prefill` comparison (N random tokens one at a
time through decode, then the same N as one batched prefill) and prints one line: cosine, max_abs_diff,
both top-1 ids, decode's top-1 lead, and PASS when the top-1 ids agree with cosine >= 0.999. Variants:

- default: as `gufo bench --validate-prefill` runs it (CUDA graphs, the default int8 limit).
- eager: no CUDA graphs.
- float-act: no int8 activations anywhere (--int8-min-weights past every matrix).
- int8-all: int8 activations for every int8-capable matrix (--int8-min-weights 0).
- f32-prefill: prefill products on float32 operands instead of float16 (int8 rounding kept).
- recurrent: prefill runs the delta rule token by token (decode's form).
- f32-prefill+recurrent: both.
- float-act+f32-prefill+recurrent: the two paths then differ only by float32 summation order (this one
  must reach cosine ~1).

f32-prefill and recurrent swap one module attribute of the library for the run (diagnosis only).

Reading it: int8 activation rounding is discontinuous, so any float difference between the two paths
(float16 prefill operands, the chunked delta rule's summation order, attention's) flips some roundings by
a whole step, and the flips compound over the layers (docs/decisions.md, "int8 activations only for large
matrices"). On the CPU (int8 activations for every quantized matrix) the 0.8B synth file gave cosine
0.9954 with the batched layers (0.9970 with the recurrent form in their prefill), while float32
activations kept the last layer's hidden state within 1.4e-5 (relative) of decode; the CPU now prefills
the hybrid token by token between batched products (docs/decisions.md, "CPU prefill of the hybrid runs
token by token"): max_abs_diff 0, as the dense models. The GPU keeps the batched layers. Expected here:
the variants with int8 activations near 0.99 on the 27B file, float-act and
float-act+f32-prefill+recurrent at or above 0.999.

On the GPU:

    python scripts/q35_validate.py qwen35-0.8b-synth-Q4_K_M.gguf
    python scripts/q35_validate.py qwen35-27b-synth-Q4_K_M.gguf --variants default,eager,float-act,int8-all
    python scripts/q35_validate.py qwen35-27b-synth-Q4_K_M.gguf \
        --variants f32-prefill,recurrent,f32-prefill+recurrent,float-act+f32-prefill+recurrent

(each variant loads the model again: the 27B's eight take several minutes, hence two runs).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

import torch

import gufo.kernels.delta_rule as delta_rule
from gufo.engine.engine import Engine
from gufo.options import KernelOptions, RunOptions
from gufo.tools.quality.validate_prefill import validate_prefill

COSINE_BAR = 0.999
NO_INT8 = 2**62  # an --int8-min-weights no matrix reaches


@contextlib.contextmanager
def swapped(module: object, name: str, value: object) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def recurrent_everywhere(*tensors: torch.Tensor, chunk: int = delta_rule.CHUNK) -> torch.Tensor:
    """`chunked_delta_rule`'s signature, decode's token-by-token form."""
    return delta_rule.recurrent_delta_rule(*tensors)


def float32_prefill() -> contextlib.AbstractContextManager[None]:
    from gufo.kernels.triton import prefill_gemm

    return swapped(prefill_gemm, "PREFILL_DTYPE", torch.float32)


def variant_context(name: str) -> contextlib.ExitStack:
    parts, stack = name.split("+"), contextlib.ExitStack()
    if "f32-prefill" in parts:
        stack.enter_context(float32_prefill())
    if "recurrent" in parts:
        stack.enter_context(swapped(delta_rule, "chunked_delta_rule", recurrent_everywhere))
    return stack


def run_options(name: str, device: str) -> RunOptions:
    parts = name.split("+")
    limit = {"float-act": NO_INT8, "int8-all": 0}.get(parts[0], KernelOptions().int8_min_weights)
    return RunOptions(
        device=device, graphs="eager" not in parts, kernels=KernelOptions(int8_min_weights=limit)
    )


VARIANTS = (
    "default",
    "eager",
    "float-act",
    "int8-all",
    "f32-prefill",
    "recurrent",
    "f32-prefill+recurrent",
    "float-act+f32-prefill+recurrent",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="GGUF file (a qwen35 or qwen3next synth file)")
    parser.add_argument("-n", "--tokens", type=int, default=256, help="validation tokens (default 256)")
    parser.add_argument("--device", default="cuda", help="device (default cuda; cpu runs the same variants)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    args = parser.parse_args()
    names = args.variants.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    for name in names:
        start = time.perf_counter()
        with variant_context(name), torch.inference_mode():
            engine = Engine(args.model, run_options(name, args.device))
            d = validate_prefill(engine, args.tokens).diff
        verdict = "PASS" if d.finite and d.top1_match and d.cosine >= COSINE_BAR else "FAIL"
        print(
            f"{name:32s} {verdict} cosine={d.cosine:.8f} max_abs_diff={d.max_abs_diff:.3e} "
            f"top1 decode={d.reference_top1} prefill={d.candidate_top1} lead={d.reference_margin:.4f} "
            f"decode_layer={engine.model.decode_route.name} {time.perf_counter() - start:.0f}s",
            flush=True,
        )
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

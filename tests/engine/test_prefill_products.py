"""`--prefill-products auto` (serve's default): gufo's fixed tiles for the architectures whose prompts can
share prefill passes (every layer self-attention and a dense FFN), cuBLAS for the others; an explicit
choice is kept. The oracle is that rule written out: which architectures are dense (docs/models.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gufo.cli.main import build_parser
from gufo.engine.engine import Engine, concrete_prefill_products
from gufo.options import KernelOptions, RunOptions

DENSE = ("llama", "qwen3", "gemma3")
HYBRID_OR_EXPERTS = ("qwen35", "qwen35moe", "qwen3next")


def products(chosen: str, architecture: str) -> str:
    options = RunOptions(kernels=KernelOptions(prefill_products=chosen))
    return concrete_prefill_products(
        options, SimpleNamespace(architecture=architecture)
    ).kernels.prefill_products


@pytest.mark.parametrize("architecture", DENSE + HYBRID_OR_EXPERTS)
def test_auto_takes_the_tiles_for_dense_attention_only(architecture):
    assert products("auto", architecture) == ("tiles" if architecture in DENSE else "cublas")
    assert products("cublas", architecture) == "cublas" and products("tiles", architecture) == "tiles"


def test_an_engine_resolves_auto_from_its_file_and_serve_defaults_to_it():
    engine = Engine("smollm2-135m", RunOptions(kernels=KernelOptions(prefill_products="auto")), context=64)
    assert engine.options.kernels.prefill_products == "tiles"  # SmolLM2 is a llama
    assert build_parser("serve").parse_args(["serve"]).prefill_products == "auto"
    assert build_parser("bench").parse_args(["bench"]).prefill_products == "cublas"

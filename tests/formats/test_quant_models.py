"""Acceptance 1 of the block formats, end to end on the CPU (and, with a GPU, through the Triton
kernels): a tiny model whose matrices are random valid blocks of one format matches its F32 twin (the
same blocks dequantized by the `gguf` package) at the final prompt position, in KL and top-1."""

from __future__ import annotations

import gguf
import pytest
import torch

from gufo.engine.engine import Engine
from gufo.kernels.cpu_int8 import CpuInt8Linear
from gufo.options import RunOptions
from tests.engine.tiny_model import write_tiny_model

Q = gguf.GGMLQuantizationType
FORMATS = [Q.Q5_1, Q.IQ4_NL, Q.IQ4_XS, Q.IQ3_S, Q.IQ3_XXS, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ1_S, Q.IQ1_M]
FORMATS += [Q.TQ1_0, Q.TQ2_0, Q.MXFP4]
MAX_KL = 0.01
PROMPT = [1, 7, 19, 4, 23, 11, 8, 30, 5, 16]
# every matrix's input width a multiple of 256 (the K and IQ super-blocks): 4 heads of 64, FFN 256;
# weights of deviation 1/sqrt(256), so that a layer neither blows its input up nor attends by a hair
SHAPE = {"arch": "llama", "n_embd": 256, "head_dim": 64, "n_heads": 4, "n_kv_heads": 2, "n_ff": 256}
SHAPE |= {"layer_std": 256**-0.5}


# the formats of the Triton kernels (the others take the torch fallback on a GPU)
TRITON_FORMATS = [Q.IQ4_NL, Q.IQ4_XS, Q.IQ3_S, Q.IQ3_XXS, Q.IQ2_XXS]


def final_logits(path, qtype: Q, device: str = "cpu") -> torch.Tensor:
    engine = Engine(path, RunOptions(device=device), context=32)
    if qtype != Q.F32 and device == "cpu" and CpuInt8Linear.available():  # the C int8 kernel, no fallback
        assert engine.model.routes()[f"linear.{qtype.name}"] == f"cpu:{CpuInt8Linear.name}"
    if qtype != Q.F32 and device == "cuda":
        assert engine.model.routes()[f"linear.{qtype.name}"] == "cuda:triton-gemv"
    return engine.prefill(PROMPT).double().cpu()


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_quantized_model_matches_its_f32_twin(tmp_path, qtype):
    check_twins(tmp_path, qtype, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", TRITON_FORMATS, ids=lambda t: t.name)
def test_quantized_model_on_the_triton_kernels_matches_its_f32_twin(tmp_path, qtype):
    """The quantized model on the GPU (Triton products), its twin on the CPU."""
    check_twins(tmp_path, qtype, "cuda")


def check_twins(tmp_path, qtype: Q, device: str) -> None:
    quantized = write_tiny_model(tmp_path / "q.gguf", qtype=qtype, **SHAPE)
    twin = write_tiny_model(tmp_path / "f32.gguf", qtype=qtype, dequantized=True, **SHAPE)
    ours, reference = final_logits(quantized, qtype, device), final_logits(twin, Q.F32)
    log_p, log_q = torch.log_softmax(reference, -1), torch.log_softmax(ours, -1)
    kl = float((log_p.exp() * (log_p - log_q)).sum())
    assert kl <= MAX_KL, kl
    assert int(ours.argmax()) == int(reference.argmax())
    assert float(reference.softmax(-1).max()) > 2 / len(reference)  # peaked: top-1 means something

"""The fused RMSNorm (alone, after a residual add, before RoPE), RoPE and gated-activation kernels against
their torch references: in the Triton
interpreter on CPU (odd sizes, strided inputs; a worker subprocess: see triton_interpreter.py) and on
real widths on a GPU when there is one."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from triton_interpreter import interpreter_tests, run_cases

from gufo.kernels import registry
from gufo.kernels.norm import ReferenceAddRmsNorm, ReferenceRmsNorm, ReferenceRmsNormRope
from gufo.kernels.pointwise import ReferenceGatedAct, ReferenceRope
from gufo.models.layers import Rope

pytest.importorskip("triton")

from gufo.kernels.triton import elementwise  # noqa: E402  (needs triton)

TOL = {"rtol": 1e-5, "atol": 1e-5}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_rms_norm(rows: int, width: int, device: str = "cpu") -> None:
    x = randn(rows, 2 * width, seed=width)[:, 1 : width + 1] * 3  # rows with a stride
    weight = randn(width, seed=1)
    want = ReferenceRmsNorm.apply(x, weight, 1e-6)
    got = elementwise.TritonRmsNorm.apply(x.to(device), weight.to(device), 1e-6).cpu()
    torch.testing.assert_close(got, want, **TOL)


def check_rope(tokens: int, heads: int, dim: int, rotated: int, neox: bool, device: str = "cpu") -> None:
    rope = Rope(rotated, 10000.0, neox)
    cos, sin = rope.tables(torch.arange(5, 5 + tokens))
    x = randn(tokens, heads, 3 * dim, seed=dim)[..., :dim]  # q out of a fused projection: strided
    want = ReferenceRope.apply(x, cos, sin, neox)
    got = elementwise.TritonRope.apply(x.to(device), cos.to(device), sin.to(device), neox).cpu()
    torch.testing.assert_close(got, want, **TOL)


def check_add_rms_norm(rows: int, width: int, device: str = "cpu") -> None:
    x = randn(rows, 2 * width, seed=width)[:, 1 : width + 1] * 3  # the residual, strided
    h = randn(rows, width, seed=width + 1)
    weight = randn(width, seed=1)
    want_sum, want = ReferenceAddRmsNorm.apply(x, h, weight, 1e-6)
    got_sum, got = elementwise.TritonAddRmsNorm.apply(x.to(device), h.to(device), weight.to(device), 1e-6)
    assert torch.equal(got_sum.cpu(), want_sum)  # one float32 add, exactly
    torch.testing.assert_close(got.cpu(), want, **TOL)


def check_rms_norm_rope(
    tokens: int, heads: int, dim: int, rotated: int, neox: bool, device: str = "cpu"
) -> None:
    rope = Rope(rotated, 10000.0, neox)
    cos, sin = rope.tables(torch.arange(7, 7 + tokens))
    x = randn(tokens, heads, 3 * dim, seed=dim)[..., :dim] * 2  # q out of a fused projection: strided
    weight = randn(dim, seed=3)
    want = ReferenceRmsNormRope.apply(x, weight, 1e-6, cos, sin, neox)
    args = (x.to(device), weight.to(device), 1e-6, cos.to(device), sin.to(device), neox)
    got = elementwise.TritonRmsNormRope.apply(*args).cpu()
    torch.testing.assert_close(got, want, **TOL)


def check_gated_act(rows: int, width: int, act: str, device: str = "cpu") -> None:
    gate, up = randn(rows, 2 * width, seed=width).mul(4).split(width, dim=-1)  # views of one product
    want = ReferenceGatedAct.apply(gate, up, act)
    got = elementwise.TritonGatedAct.apply(gate.to(device), up.to(device), act).cpu()
    torch.testing.assert_close(got, want, **TOL)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {
        "rms_norm-3x97": lambda: check_rms_norm(3, 97),
        "rms_norm-2x64": lambda: check_rms_norm(2, 64),
        "rms_norm-empty": lambda: check_rms_norm(0, 64),
        "add_rms_norm-3x97": lambda: check_add_rms_norm(3, 97),
        "add_rms_norm-empty": lambda: check_add_rms_norm(0, 64),
    }
    for neox in (True, False):
        cases[f"rope-full-neox{neox}"] = lambda n=neox: check_rope(3, 5, 64, 64, n)
        cases[f"rope-partial-neox{neox}"] = lambda n=neox: check_rope(2, 3, 48, 16, n)  # rotates 16 of 48
        cases[f"rms_norm_rope-full-neox{neox}"] = lambda n=neox: check_rms_norm_rope(3, 5, 64, 64, n)
        cases[f"rms_norm_rope-partial-neox{neox}"] = lambda n=neox: check_rms_norm_rope(2, 3, 48, 16, n)
    for act in ("silu", "gelu_tanh"):
        cases[f"gated_act-{act}"] = lambda a=act: check_gated_act(3, 1500, a)  # two programs, a tail
    return cases


interpreter_results, test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


@pytest.mark.parametrize("op", ["rms_norm", "rope", "gated_act", "add_rms_norm", "rms_norm_rope"])
def test_registered_on_cuda_backend(op):
    assert registry.lookup("cuda", op)[0] == "cuda"


if __name__ == "__main__":  # the interpreter worker (TRITON_INTERPRET=1 was set before importing triton)
    print(json.dumps(run_cases(interpreter_cases())))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_real_widths():
    """Qwen3-8B / gemma3 widths: 4096-wide norms, 128-wide heads, 12288-wide FFN."""
    check_rms_norm(37, 4096, "cuda")
    check_rms_norm(300, 128, "cuda")  # QK norm: one row per head
    check_add_rms_norm(37, 4096, "cuda")
    for neox in (True, False):
        check_rope(37, 32, 128, 128, neox, "cuda")
        check_rms_norm_rope(37, 32, 128, 128, neox, "cuda")
    check_rms_norm_rope(5, 24, 256, 64, True, "cuda")  # qwen35's gated attention: 64 of 256 rotated
    check_gated_act(37, 12288, "silu", "cuda")
    check_gated_act(5, 2048, "gelu_tanh", "cuda")

"""The fused RMSNorm (alone, after a residual add, before RoPE), RoPE and gated-activation kernels against
their torch references: in the Triton
interpreter on CPU (odd sizes, strided inputs; a worker subprocess: see triton_interpreter.py) and on
real widths on a GPU when there is one."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from kv_paging import UNUSED, paged
from triton_interpreter import interpreter_tests

from gufo.kernels import contracts, registry
from gufo.kernels.catalog import register_all
from gufo.kernels.kv_pages import TRASH_PAGE
from gufo.kernels.norm import (
    ReferenceAddRmsNorm,
    ReferenceAttentionHeads,
    ReferenceGatedRmsNorm,
    ReferenceRmsNorm,
    ReferenceRmsNormRope,
)
from gufo.kernels.pointwise import ReferenceGatedAct, ReferenceRope
from gufo.models.rope import Rope, Yarn

pytest.importorskip("triton")

from gufo.kernels.triton import elementwise, gemv_int8  # noqa: E402  (needs triton)
from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402

LAUNCH = DependentLaunch(enabled=True)  # dependent launches where the device has them (never here)

TOL = {"rtol": 1e-5, "atol": 1e-5}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_rms_norm(rows: int, width: int, device: str = "cpu") -> None:
    x = randn(rows, 2 * width, seed=width)[:, 1 : width + 1] * 3  # rows with a stride
    weight = randn(width, seed=1)
    want = ReferenceRmsNorm.apply(x, weight, 1e-6)
    got = elementwise.TritonRmsNorm(LAUNCH).apply(x.to(device), weight.to(device), 1e-6).cpu()
    torch.testing.assert_close(got, want, **TOL)


def make_rope(rotated: int, neox: bool, yarn: bool) -> Rope:
    """Plain RoPE, or YaRN (factor 4 over an original context of 16, attention factor 1.139) on
    llama3-style frequency factors: tables whose amplitude is not 1 and whose frequencies blend."""
    if not yarn:
        return Rope(rotated, 10000.0, neox)
    factors = tuple(1.0 + i / rotated for i in range(rotated // 2))
    return Rope(rotated, 10000.0, neox, 4.0, factors, Yarn(16), 1.0 + 0.1 * math.log(4.0))


def check_rope(
    tokens: int, heads: int, dim: int, rotated: int, neox: bool, device: str = "cpu", yarn: bool = False
) -> None:
    rope = make_rope(rotated, neox, yarn)
    cos, sin = rope.tables(torch.arange(5, 5 + tokens))
    x = randn(tokens, heads, 3 * dim, seed=dim)[..., :dim]  # q out of a fused projection: strided
    want = ReferenceRope.apply(x, cos, sin, neox)
    got = elementwise.TritonRope(LAUNCH).apply(x.to(device), cos.to(device), sin.to(device), neox).cpu()
    torch.testing.assert_close(got, want, **TOL)


def check_add_rms_norm(rows: int, width: int, device: str = "cpu") -> None:
    x = randn(rows, 2 * width, seed=width)[:, 1 : width + 1] * 3  # the residual, strided
    h = randn(rows, width, seed=width + 1)
    weight = randn(width, seed=1)
    want_sum, want = ReferenceAddRmsNorm.apply(x, h, weight, 1e-6)
    got_sum, got = elementwise.TritonAddRmsNorm(LAUNCH).apply(
        x.to(device), h.to(device), weight.to(device), 1e-6
    )
    assert torch.equal(got_sum.cpu(), want_sum)  # one float32 add, exactly
    torch.testing.assert_close(got.cpu(), want, **TOL)


def check_gated_rms_norm(tokens: int, heads: int, width: int, device: str = "cpu") -> None:
    """Close to the reference, x a delta rule's output, z a part of a fused projection's rows (strided)."""
    x = randn(tokens, heads, width, seed=width) * 3
    z = randn(tokens, 3 * heads * width, seed=width + 1)[:, : heads * width].reshape(tokens, heads, width)
    weight = randn(width, seed=2)
    want = ReferenceGatedRmsNorm.apply(x, z, weight, 1e-6)
    got = elementwise.TritonGatedRmsNorm(LAUNCH).apply(x.to(device), z.to(device), weight.to(device), 1e-6)
    torch.testing.assert_close(got.cpu(), want, **TOL)


def check_rms_norm_rope(
    tokens: int, heads: int, dim: int, rotated: int, neox: bool, device: str = "cpu", yarn: bool = False
) -> None:
    rope = make_rope(rotated, neox, yarn)
    cos, sin = rope.tables(torch.arange(7, 7 + tokens))
    x = randn(tokens, heads, 3 * dim, seed=dim)[..., :dim] * 2  # q out of a fused projection: strided
    weight = randn(dim, seed=3)
    want = ReferenceRmsNormRope.apply(x, weight, 1e-6, cos, sin, neox)
    args = (x.to(device), weight.to(device), 1e-6, cos.to(device), sin.to(device), neox)
    got = elementwise.TritonRmsNormRope(LAUNCH).apply(*args).cpu()
    torch.testing.assert_close(got, want, **TOL)


def check_gated_act(rows: int, width: int, act: str, device: str = "cpu") -> None:
    gate, up = randn(rows, 2 * width, seed=width).mul(4).split(width, dim=-1)  # views of one product
    want = ReferenceGatedAct.apply(gate, up, act)
    got = elementwise.TritonGatedAct(LAUNCH).apply(gate.to(device), up.to(device), act).cpu()
    torch.testing.assert_close(got, want, **TOL)


def check_attention_heads(
    tokens: int,
    heads: int,
    kv_heads: int,
    dim: int,
    rotated: int,
    neox: bool,
    norm: bool,
    device: str = "cpu",
) -> None:
    """Against the torch reference (close), and bit for bit against the unfused kernels it replaces at
    decode (the QK norm + RoPE kernels, then the cache dtype conversion): graph replays, which take the
    fused kernel, must give eager steps' numbers."""
    rope = Rope(rotated, 10000.0, neox)
    positions = torch.arange(9, 9 + tokens)
    cos, sin = rope.tables(positions)
    widths = (heads * dim, kv_heads * dim, kv_heads * dim)
    q, k, v = (
        t.reshape(tokens, -1, dim) for t in randn(tokens, sum(widths), seed=dim).mul(2).split(widths, -1)
    )
    q_weight, k_weight = (randn(dim, seed=s) for s in (3, 4)) if norm else (None, None)
    entries = torch.full((2, kv_heads, 9 + tokens + 3, dim), 7.0, dtype=torch.float16)
    context = entries.shape[2]
    args = (q, k, v, q_weight, k_weight, 1e-6, cos, sin, neox)
    want_pages = paged(entries[0][None], entries[1][None], 4, seed=tokens)
    want = ReferenceAttentionHeads.apply(*args, want_pages, positions, 0)
    on_device = [None if t is None else t.to(device) for t in args[:5]] + [
        1e-6,
        cos.to(device),
        sin.to(device),
        neox,
    ]
    # another order of pages than the reference's: the kernel must follow the table
    got_pages = paged(entries[0][None].to(device), entries[1][None].to(device), 4, seed=tokens + 1)
    got = elementwise.TritonAttentionHeads(LAUNCH).apply(*on_device, got_pages, positions.to(device), 0).cpu()
    torch.testing.assert_close(got, want, **TOL)
    got_entries = torch.stack(got_pages.entries(0, context)).cpu()
    torch.testing.assert_close(got_entries, torch.stack(want_pages.entries(0, context)), rtol=1e-3, atol=1e-3)
    rotate = (
        (lambda x, w: elementwise.TritonRmsNormRope(LAUNCH).apply(x, w, 1e-6, *on_device[6:]))
        if norm
        else (lambda x, w: elementwise.TritonRope(LAUNCH).apply(x, *on_device[6:]))
    )
    assert torch.equal(got, rotate(on_device[0], on_device[3]).cpu())
    rows = got_entries[:, :, positions]
    assert torch.equal(rows[0], rotate(on_device[1], on_device[4]).transpose(0, 1).half().cpu())
    assert torch.equal(rows[1], on_device[2].transpose(0, 1).half().cpu())
    untouched = torch.ones(context, dtype=torch.bool)
    untouched[positions] = False
    assert torch.equal(got_entries[:, :, untouched], entries[:, :, untouched])
    assert bool((got_pages.keys[:, TRASH_PAGE] == UNUSED).all())  # the trash page too


def check_attention_heads_slots(device: str = "cpu") -> None:
    """Tokens of several sequences into the pages of three slots, token t into slot slots[t]: the
    reference's entries and heads (close), and bit for bit each token alone into its own slot; the
    other slots and positions untouched."""
    heads, kv_heads, dim = 6, 2, 48
    rope = Rope(dim, 10000.0, True)
    slots, positions = torch.tensor([2, 0]), torch.tensor([9, 4])
    cos, sin = rope.tables(positions)
    widths = (heads * dim, kv_heads * dim, kv_heads * dim)
    q, k, v = (t.reshape(2, -1, dim) for t in randn(2, sum(widths), seed=7).mul(2).split(widths, -1))
    weights = tuple(randn(dim, seed=s) for s in (3, 4))
    args = (q, k, v, *weights, 1e-6, cos, sin, True)
    entries = torch.full((2, 3, kv_heads, 12, dim), 7.0, dtype=torch.float16)  # keys, values
    want_pages = paged(*entries, 4, seed=1)
    want = ReferenceAttentionHeads.apply(*args, want_pages, positions, slots)
    heads_kernel = elementwise.TritonAttentionHeads(LAUNCH)
    on_device = [t.to(device) if isinstance(t, torch.Tensor) else t for t in args]
    got_pages = paged(*entries.to(device), 4, seed=2)
    got = heads_kernel.apply(*on_device, got_pages, positions.to(device), slots.to(device))
    torch.testing.assert_close(got.cpu(), want, **TOL)
    for slot in range(3):
        mine, theirs = torch.stack(got_pages.entries(slot, 12)), torch.stack(want_pages.entries(slot, 12))
        torch.testing.assert_close(mine.cpu(), theirs, rtol=1e-3, atol=1e-3)
    alone_pages = paged(*entries.to(device), 4, seed=2)
    for t, slot in enumerate(slots.tolist()):
        one = [x[t : t + 1] for x in on_device[:3]] + on_device[3:6] + [x[t : t + 1] for x in on_device[6:8]]
        alone = heads_kernel.apply(*one, True, alone_pages, positions[t : t + 1].to(device), slot)
        assert torch.equal(alone[0], got[t]), t
    assert torch.equal(alone_pages.keys, got_pages.keys) and torch.equal(alone_pages.values, got_pages.values)
    assert torch.equal(torch.stack(got_pages.entries(1, 12)).cpu(), entries[:, 1])  # a slot no token names


def check_int8_outputs(rows: int, width: int, device: str = "cpu") -> None:
    """The norms and the activation with `int8`: bit for bit their float output through the separate
    quantizer (`quantize_rows`, itself bit for bit the torch oracle): fusing it changes no number."""
    x = randn(rows, 2 * width, seed=width)[:, 1 : width + 1].mul(3).to(device)  # strided rows
    h, weight = randn(rows, width, seed=2).to(device), randn(width, seed=1).to(device)
    gate, up = randn(rows, 2 * width, seed=width).mul(4).to(device).split(width, dim=-1)
    pairs = [
        (
            elementwise.TritonRmsNorm(LAUNCH).apply(x, weight, 1e-6),
            elementwise.TritonRmsNorm(LAUNCH).apply(x, weight, 1e-6, True),
        ),
        (
            elementwise.TritonAddRmsNorm(LAUNCH).apply(x, h, weight, 1e-6)[1],
            elementwise.TritonAddRmsNorm(LAUNCH).apply(x, h, weight, 1e-6, True)[1],
        ),
        (
            elementwise.TritonGatedAct(LAUNCH).apply(gate, up, "silu"),
            elementwise.TritonGatedAct(LAUNCH).apply(gate, up, "silu", True),
        ),
    ]
    for plain, fused in pairs:
        for mine, oracle in zip(fused, gemv_int8.quantize_rows(plain, LAUNCH), strict=True):
            assert torch.equal(mine, oracle)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    cases: dict[str, Callable[[], None]] = {
        "rms_norm-3x97": lambda: check_rms_norm(3, 97),
        "rms_norm-2x64": lambda: check_rms_norm(2, 64),
        "rms_norm-empty": lambda: check_rms_norm(0, 64),
        "add_rms_norm-3x97": lambda: check_add_rms_norm(3, 97),
        "add_rms_norm-empty": lambda: check_add_rms_norm(0, 64),
        "gated_rms_norm-3x5x40": lambda: check_gated_rms_norm(3, 5, 40),
        "gated_rms_norm-empty": lambda: check_gated_rms_norm(0, 2, 64),
        "int8-3x96": lambda: check_int8_outputs(3, 96),  # tail blocks of a 128-wide program
        "int8-2x1504": lambda: check_int8_outputs(2, 1504),  # the activation's second program partly full
    }
    for neox in (True, False):
        cases[f"rope-full-neox{neox}"] = lambda n=neox: check_rope(3, 5, 64, 64, n)
        cases[f"rope-partial-neox{neox}"] = lambda n=neox: check_rope(2, 3, 48, 16, n)  # rotates 16 of 48
        cases[f"rms_norm_rope-full-neox{neox}"] = lambda n=neox: check_rms_norm_rope(3, 5, 64, 64, n)
        cases[f"rms_norm_rope-partial-neox{neox}"] = lambda n=neox: check_rms_norm_rope(2, 3, 48, 16, n)
        cases[f"rope-yarn-neox{neox}"] = lambda n=neox: check_rope(3, 5, 64, 64, n, yarn=True)
        cases[f"rms_norm_rope-yarn-neox{neox}"] = lambda n=neox: check_rms_norm_rope(
            2, 3, 48, 16, n, yarn=True
        )
        for norm in (True, False):
            cases[f"attention_heads-neox{neox}-norm{norm}"] = lambda n=neox, m=norm: check_attention_heads(
                2, 6, 2, 48, 16 if n else 48, n, m
            )
    cases["attention_heads-slots"] = check_attention_heads_slots
    for act in ("silu", "gelu_tanh"):
        cases[f"gated_act-{act}"] = lambda a=act: check_gated_act(3, 1500, a)  # two programs, a tail
    return cases


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_row_kernels_check_their_operands():
    """Shapes and devices are checked before any launch: each mismatch is an error naming it."""
    x, weight = torch.zeros(2, 64), torch.zeros(64)
    with pytest.raises(ValueError, match="norm weight width: 32, expected 64"):
        elementwise.TritonRmsNorm(LAUNCH).apply(x, weight[:32], 1e-6)
    with pytest.raises(ValueError, match="norm weight is on meta, expected cpu"):
        elementwise.TritonRmsNorm(LAUNCH).apply(x, weight.to("meta"), 1e-6)
    with pytest.raises(ValueError, match="residual add: h has shape \\(2, 32\\), x \\(2, 64\\)"):
        elementwise.TritonAddRmsNorm(LAUNCH).apply(x, x[:, :32], weight, 1e-6)
    with pytest.raises(ValueError, match="gated activation: up has shape"):
        elementwise.TritonGatedAct(LAUNCH).apply(x, x[:1], "silu")
    heads, tables = torch.zeros(2, 4, 64), torch.zeros(2, 64)
    with pytest.raises(ValueError, match="cos table rows \\(one per token\\): 1, expected 2"):
        elementwise.TritonRope(LAUNCH).apply(heads, tables[:1], tables, True)
    with pytest.raises(ValueError, match="sin table: 128 rotated dims for heads 64 wide"):
        elementwise.TritonRope(LAUNCH).apply(heads, tables, torch.zeros(2, 128), True)
    with pytest.raises(ValueError, match="x: \\[tokens, heads, head_dim\\] expected"):
        elementwise.TritonRmsNormRope(LAUNCH).apply(x, weight, 1e-6, tables, tables, True)


@pytest.mark.parametrize(
    "op",
    [
        contracts.RMS_NORM,
        contracts.ROPE,
        contracts.GATED_ACT,
        contracts.ADD_RMS_NORM,
        contracts.GATED_RMS_NORM,
        contracts.RMS_NORM_ROPE,
        contracts.ATTENTION_HEADS,
    ],
    ids=lambda op: op.name,
)
def test_registered_on_cuda_backend(op):
    register_all("cuda")
    assert registry.lookup("cuda", op)[0] == "cuda"


@pytest.mark.gpu
def test_gpu_real_widths():
    """Qwen3-8B / gemma3 widths: 4096-wide norms, 128-wide heads, 12288-wide FFN."""
    check_rms_norm(37, 4096, "cuda")
    check_rms_norm(300, 128, "cuda")  # QK norm: one row per head
    check_add_rms_norm(37, 4096, "cuda")
    check_gated_rms_norm(5, 48, 128, "cuda")  # Qwen3.5-27B's DeltaNet output gate
    for neox in (True, False):
        check_rope(37, 32, 128, 128, neox, "cuda")
        check_rms_norm_rope(37, 32, 128, 128, neox, "cuda")
        check_rope(37, 32, 128, 128, neox, "cuda", yarn=True)
        check_rms_norm_rope(37, 32, 128, 128, neox, "cuda", yarn=True)
    check_rms_norm_rope(5, 24, 256, 64, True, "cuda")  # qwen35's gated attention: 64 of 256 rotated
    for norm in (True, False):
        check_attention_heads(3, 32, 8, 128, 128, True, norm, "cuda")  # qwen3 8B, speculative drafts
    check_attention_heads_slots("cuda")
    check_gated_act(37, 12288, "silu", "cuda")
    check_int8_outputs(5, 4096, "cuda")
    check_int8_outputs(5, 12288, "cuda")
    check_gated_act(5, 2048, "gelu_tanh", "cuda")

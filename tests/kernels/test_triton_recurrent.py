"""The recurrent layers' decode kernels (causal conv update, gated delta rule) against their torch
references: rows of several sequences in one launch, each over its own slot's state, in the Triton
interpreter on CPU (a worker subprocess: see triton_interpreter.py) and on real widths on a GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from triton_interpreter import interpreter_tests

from gufo.kernels import registry
from gufo.kernels.catalog import register_all
from gufo.kernels.causal_conv import ReferenceCausalConv1d
from gufo.kernels.contracts import CAUSAL_CONV1D, GATED_DELTA_RULE, DeltaGates
from gufo.kernels.delta_rule import ReferenceGatedDeltaRule

pytest.importorskip("triton")

from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402  (needs triton)
from gufo.kernels.triton.recurrent import TritonCausalConv1d, TritonGatedDeltaRule  # noqa: E402

LAUNCH = DependentLaunch(enabled=True)  # dependent launches where the device has them (never here)
CONV, DELTA = TritonCausalConv1d(LAUNCH), TritonGatedDeltaRule(LAUNCH)
DELTA_SEQUENCE = TritonGatedDeltaRule(LAUNCH, prefill="recurrent")
SLOTS = (2, 0, 3)  # rows into three of four slots, out of order; slot 1 is no row's


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check_conv_slots(channels: int, width: int, device: str = "cpu") -> None:
    """Bit for bit the reference's sums (window and shifted state too), each row bit for bit its one-slot
    launch, the unnamed slot untouched."""
    gen = generator(channels)
    x = torch.randn(len(SLOTS), 2 * channels, generator=gen)[:, :channels]  # a fused projection's part
    weight = torch.randn(channels, width, generator=gen)
    state = torch.randn(4, channels, width - 1, generator=gen)
    slots = torch.tensor(SLOTS)
    want_state = state.clone()
    want = ReferenceCausalConv1d.apply(x, want_state, weight, slots)
    got_state, rows = state.clone().to(device), slots.to(device)  # .to(cpu) would not copy
    got = CONV.apply(x.to(device), got_state, weight.to(device), rows)
    assert torch.equal(got.cpu(), want) and torch.equal(got_state.cpu(), want_state)
    assert torch.equal(got_state.cpu()[1], state[1])
    alone_state = state.clone().to(device)
    for t, slot in enumerate(SLOTS):
        alone = CONV.apply(x[t : t + 1].to(device), alone_state[slot], weight.to(device))
        assert torch.equal(alone[0], got[t]), t
    assert torch.equal(alone_state, got_state)
    # the window shifted by one token: the last K - 2 columns, then the token
    torch.testing.assert_close(
        got_state.cpu()[list(SLOTS)], torch.cat((state[list(SLOTS), :, 1:], x[:, :, None]), -1)
    )


def delta_inputs(heads: int, key_dim: int, value_dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    """q, k (not normalised: the kernel's own L2 norm), v, log decay g <= 0, beta, and 4 slots' states."""
    gen = generator(seed)
    n = len(SLOTS)
    q, k = (torch.randn(n, heads, key_dim, generator=gen) * 2 for _ in range(2))
    v = torch.randn(n, heads, value_dim, generator=gen)
    g = -F.softplus(torch.randn(n, heads, generator=gen))
    beta = torch.sigmoid(torch.randn(n, heads, generator=gen))
    state = torch.randn(4, heads, key_dim, value_dim, generator=gen) * 0.3
    return q, k, v, g, beta, state


def check_delta_slots(heads: int, key_dim: int, value_dim: int, normalize: bool, device: str = "cpu") -> None:
    """Close to the float64 reference (output and states), each row bit for bit its one-slot launch,
    the unnamed slot untouched."""
    q, k, v, g, beta, state = delta_inputs(heads, key_dim, value_dim, key_dim + value_dim)
    if not normalize:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    eps = 1e-6 if normalize else None
    slots, scale = torch.tensor(SLOTS), key_dim**-0.5
    want_state = state.double()
    want = ReferenceGatedDeltaRule.apply(
        *(t.double() for t in (q, k, v, g, beta)), want_state, scale, slots, eps
    )
    on_device = [t.to(device) for t in (q, k, v, g, beta)]
    got_state = state.clone().to(device)
    got = DELTA.apply(*on_device, got_state, scale, slots.to(device), eps)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state.double().cpu(), want_state, rtol=1e-5, atol=1e-5)
    assert torch.equal(got_state.cpu()[1], state[1])
    alone_state = state.clone().to(device)
    for t, slot in enumerate(SLOTS):
        one = [x[t : t + 1] for x in on_device]
        assert torch.equal(DELTA.apply(*one, alone_state[slot], scale, None, eps)[0], got[t]), t
    assert torch.equal(alone_state, got_state)


def check_several_tokens_of_one_sequence() -> None:
    """Prefill's tokens of one slot run the reference (the chunked form), bit for bit."""
    q, k, v, g, beta, state = delta_inputs(2, 16, 8, 1)
    want_state, got_state = state[0].clone(), state[0].clone()
    want = ReferenceGatedDeltaRule.apply(q, k, v, g, beta, want_state, 0.25, None, 1e-6)
    got = DELTA.apply(q, k, v, g, beta, got_state, 0.25, None, 1e-6)
    assert torch.equal(got, want) and torch.equal(got_state, want_state)
    x, weight, conv_state = torch.randn(5, 6), torch.randn(6, 4), torch.randn(6, 3)
    want_conv_state = conv_state.clone()
    want_conv = ReferenceCausalConv1d.apply(x, want_conv_state, weight)
    assert torch.equal(CONV.apply(x, conv_state, weight), want_conv)
    assert torch.equal(conv_state, want_conv_state)


def check_sequence_is_its_steps(
    tokens: int, heads: int, key_dim: int, value_dim: int, device: str = "cpu"
) -> None:
    """The tokens of one sequence in one launch (`sequence`): outputs and state bit for bit those of the
    same tokens stepped one launch each, alone and as slot-indexed decode rows; close to the float64
    recurrent reference."""
    gen = generator(tokens + key_dim)
    q, k = (torch.randn(tokens, heads, key_dim, generator=gen) * 2 for _ in range(2))
    v = torch.randn(tokens, heads, value_dim, generator=gen)
    g = -F.softplus(torch.randn(tokens, heads, generator=gen)) * 4  # strong gates too
    beta = torch.sigmoid(torch.randn(tokens, heads, generator=gen))
    state = torch.randn(heads, key_dim, value_dim, generator=gen) * 0.3
    scale, eps = key_dim**-0.5, 1e-6
    want_state = state.double()
    oracle = (t.double() for t in (q, k, v, g, beta))
    want = ReferenceGatedDeltaRule.apply(*oracle, want_state, scale, None, eps)
    check_launch_is_its_steps((q, k, v, g, beta), state, scale, (eps,), want, want_state, device)


def check_launch_is_its_steps(
    inputs: tuple[torch.Tensor, ...],
    state: torch.Tensor,
    scale: float,
    options: tuple,
    want: torch.Tensor,
    want_state: torch.Tensor,
    device: str,
) -> None:
    """One sequence's op inputs (q, k, v, g, beta; then `options` after the slots) in one launch: close
    to the float64 oracle's (want, want_state), and bit for bit its tokens stepped one launch each,
    alone and as slot-indexed decode rows."""
    on_device = [t.to(device) for t in inputs]
    got_state = state.clone().to(device)
    got = DELTA_SEQUENCE.apply(*on_device, got_state, scale, None, *options)
    torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_state.double().cpu(), want_state, rtol=1e-5, atol=1e-5)
    alone_state, rows_state = state.clone().to(device), state[None].clone().to(device)
    slot = torch.zeros(1, dtype=torch.int64, device=device)
    for t in range(inputs[0].shape[0]):
        one = [x[t : t + 1] for x in on_device]
        assert torch.equal(DELTA.apply(*one, alone_state, scale, None, *options)[0], got[t]), t
        assert torch.equal(DELTA.apply(*one, rows_state, scale, slot, *options)[0], got[t]), t
    assert torch.equal(alone_state, got_state) and torch.equal(rows_state[0], got_state)


def gate_logits(tokens: int, heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    """The projections' alpha and beta logits [T, H] and a layer's gate parameters (DeltaGates' decay
    -exp(A_log) and dt bias [H]), strong decays too."""
    gen = generator(seed)
    alpha, b = (torch.randn(tokens, heads, generator=gen) * 3 for _ in range(2))
    decay = -torch.exp(torch.randn(heads, generator=gen) * 1.5)
    return alpha, b, decay, torch.randn(heads, generator=gen)


def check_gates_and_key_heads(
    tokens: int, key_heads: int, heads: int, key_dim: int, value_dim: int, tiled: bool, device: str = "cpu"
) -> None:
    """With DeltaGates and fewer key heads: close to the float64 reference given the gates and heads
    formed by hand (torch's softplus and sigmoid, q and k repeated to the value heads); one sequence's
    tokens in one launch bit for bit those tokens stepped alone and as slot-indexed rows."""
    gen = generator(tokens + heads)
    q, k = (torch.randn(tokens, key_heads, key_dim, generator=gen) * 2 for _ in range(2))
    v = torch.randn(tokens, heads, value_dim, generator=gen)
    alpha, b, decay, bias = gate_logits(tokens, heads, heads + key_dim)
    state = torch.randn(heads, key_dim, value_dim, generator=gen) * 0.3
    scale, eps, per_key = key_dim**-0.5, 1e-6, heads // key_heads
    expand = (lambda t: t.repeat(1, per_key, 1)) if tiled else (lambda t: t.repeat_interleave(per_key, 1))
    g, beta = decay * F.softplus(alpha + bias), torch.sigmoid(b)
    want_state = state.double()
    oracle = (t.double() for t in (expand(q), expand(k), v, g, beta))
    want = ReferenceGatedDeltaRule.apply(*oracle, want_state, scale, None, eps)
    options = (eps, DeltaGates(decay.to(device), bias.to(device)), tiled)
    check_launch_is_its_steps((q, k, v, alpha, b), state, scale, options, want, want_state, device)


def check_restart(device: str = "cpu") -> None:
    """A one-slot pass given `restart`: at position 0 the state counts as zeros (the result and the state
    after it those of a pass from a zero state), at any other position it continues the state; for one
    token and (the chunked and the recurrent prefill) several."""
    q, k, v, g, beta, states = delta_inputs(2, 16, 8, 5)
    x, weight, conv_state = torch.randn(3, 6), torch.randn(6, 4), torch.randn(6, 3)
    for position, tokens in ((0, 1), (4, 1), (0, 3), (4, 3)):
        restart = torch.tensor([position], device=device)
        start_delta = states[0] if position else torch.zeros_like(states[0])
        start_conv = conv_state if position else torch.zeros_like(conv_state)
        want_conv_state, want_state = start_conv.clone(), start_delta.double()
        want_conv = ReferenceCausalConv1d.apply(x[:tokens], want_conv_state, weight)
        oracle = (t[:tokens].double() for t in (q, k, v, g, beta))
        want = ReferenceGatedDeltaRule.apply(*oracle, want_state, 0.25, None, 1e-6)
        got_conv_state = conv_state.clone().to(device)
        got_conv = CONV.apply(x[:tokens].to(device), got_conv_state, weight.to(device), None, restart)
        assert torch.equal(got_conv.cpu(), want_conv) and torch.equal(got_conv_state.cpu(), want_conv_state)
        for kernel in (DELTA, DELTA_SEQUENCE):
            got_state = states[0].clone().to(device)
            on_device = [t[:tokens].to(device) for t in (q, k, v, g, beta)]
            got = kernel.apply(*on_device, got_state, 0.25, None, 1e-6, None, True, restart)
            torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got_state.double().cpu(), want_state, rtol=1e-5, atol=1e-5)


def interpreter_cases() -> dict[str, Callable[[], None]]:
    return {
        "conv-slots-k4": lambda: check_conv_slots(600, 4),  # two programs, the second partly full
        "conv-slots-k2": lambda: check_conv_slots(24, 2),
        "delta-slots-normalize": lambda: check_delta_slots(3, 16, 40, True),  # a partial value block
        "delta-slots-given-normalised": lambda: check_delta_slots(2, 24, 16, False),  # Dk not a power of 2
        "several-tokens-of-one-sequence": check_several_tokens_of_one_sequence,
        "sequence-is-its-steps": lambda: check_sequence_is_its_steps(7, 2, 24, 40),  # partial blocks
        "gates-key-heads-tiled": lambda: check_gates_and_key_heads(5, 2, 6, 16, 24, True),
        "gates-key-heads-grouped": lambda: check_gates_and_key_heads(4, 2, 4, 24, 16, False),
        "gates-one-head-each": lambda: check_gates_and_key_heads(3, 3, 3, 16, 16, True),
        "restart": check_restart,
    }


test_kernel_in_interpreter = interpreter_tests(interpreter_cases, __file__)


def test_kernels_check_their_operands():
    """A slot-indexed launch takes the layer's state of every slot and one slot per token."""
    q, state = torch.zeros(2, 2, 16), torch.zeros(3, 2, 16, 8)
    v, gates = torch.zeros(2, 2, 8), torch.zeros(2, 2)
    with pytest.raises(ValueError, match="state: 4 dimensions expected"):
        DELTA.apply(q, q, v, gates, gates, state[0], 1.0, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="slots entries \\(one per token\\): 1, expected 2"):
        DELTA.apply(q, q, v, gates, gates, state, 1.0, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="v: shape \\(2, 2, 4\\), expected \\(2, 2, 8\\)"):
        DELTA.apply(q, q, v[..., :4], gates, gates, state, 1.0, torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="state columns \\(kernel - 1\\): 2, expected 3"):
        CONV.apply(torch.zeros(1, 6), torch.zeros(6, 2), torch.zeros(6, 4))


@pytest.mark.parametrize("op", [CAUSAL_CONV1D, GATED_DELTA_RULE], ids=lambda op: op.name)
def test_registered_on_cuda_backend(op):
    register_all("cuda")
    assert registry.lookup("cuda", op)[0] == "cuda"


@pytest.mark.gpu
def test_gpu_real_widths():
    """Qwen3.5-0.8B's DeltaNet: 6144 conv channels of kernel 4, 16 value heads of 128 x 128."""
    check_conv_slots(6144, 4, "cuda")
    check_delta_slots(16, 128, 128, True, "cuda")
    check_sequence_is_its_steps(300, 48, 128, 128, "cuda")  # Qwen3.5-27B's 48 value heads
    check_gates_and_key_heads(300, 16, 48, 128, 128, True, "cuda")  # and its 16 key heads
    check_restart("cuda")

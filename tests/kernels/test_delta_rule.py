"""Gated delta rule and causal conv: the recurrent and chunked forms agree with each other and with
transformers' torch references (Qwen3.5's), also when a sequence is cut into pieces."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gufo.kernels.causal_conv import ReferenceCausalConv1d
from gufo.kernels.delta_rule import ReferenceGatedDeltaRule, chunked_delta_rule, recurrent_delta_rule

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

H, DK, DV = 3, 16, 24


def inputs(n_tokens: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(n_tokens, H, DK, generator=g), dim=-1)
    k = F.normalize(torch.randn(n_tokens, H, DK, generator=g), dim=-1)
    v = torch.randn(n_tokens, H, DV, generator=g)
    decay = -F.softplus(torch.randn(n_tokens, H, generator=g)) * 0.5  # log decay <= 0
    beta = torch.sigmoid(torch.randn(n_tokens, H, generator=g))
    state = torch.randn(H, DK, DV, generator=g) * 0.3
    return q, k, v, decay, beta, state


@pytest.mark.parametrize("n_tokens", [1, 5, 64, 150])
def test_chunked_equals_recurrent_and_transformers(n_tokens):
    q, k, v, decay, beta, state = inputs(n_tokens, n_tokens)
    rec_state, chunk_state = state.clone(), state.clone()
    rec = recurrent_delta_rule(q, k, v, decay, beta, rec_state)
    chunked = chunked_delta_rule(q, k, v, decay, beta, chunk_state)
    assert torch.allclose(chunked, rec, atol=2e-5, rtol=1e-4)
    assert torch.allclose(chunk_state, rec_state, atol=2e-5, rtol=1e-4)
    # transformers scales q by DK**-0.5 itself and takes [batch, T, H, D]
    expected, expected_state = qwen3_5.torch_chunk_gated_delta_rule(
        (q * DK**0.5)[None], k[None], v[None], decay[None], beta[None],
        initial_state=state[None], output_final_state=True,
    )  # fmt: skip
    assert torch.allclose(rec, expected[0], atol=2e-5, rtol=1e-4)
    assert torch.allclose(rec_state, expected_state[0], atol=2e-5, rtol=1e-4)


def test_op_applies_the_scale_and_continues_across_calls():
    q, k, v, decay, beta, state = inputs(100, 7)
    whole_state, piece_state = state.clone(), state.clone()
    op = ReferenceGatedDeltaRule.apply
    whole = op(q, k, v, decay, beta, whole_state, 0.25)
    pieces = [
        op(q[a:b], k[a:b], v[a:b], decay[a:b], beta[a:b], piece_state, 0.25)
        for a, b in ((0, 70), (70, 71), (71, 100))
    ]
    assert torch.allclose(torch.cat(pieces), whole, atol=2e-5, rtol=1e-4)
    assert torch.allclose(piece_state, whole_state, atol=2e-5, rtol=1e-4)
    assert torch.allclose(
        whole, recurrent_delta_rule(q * 0.25, k, v, decay, beta, state.clone()), atol=2e-5, rtol=1e-4
    )


def test_causal_conv_in_pieces_equals_transformers_on_the_whole():
    g = torch.Generator().manual_seed(3)
    channels, kernel, n_tokens = 10, 4, 23
    x = torch.randn(n_tokens, channels, generator=g)
    weight = torch.randn(channels, kernel, generator=g)
    expected = qwen3_5.causal_conv1d_fn(x.T[None], weight)[0].T  # zero history, no activation
    state = torch.zeros(channels, kernel - 1)
    pieces = [
        ReferenceCausalConv1d.apply(x[a:b], state, weight) for a, b in ((0, 9), (9, 10), (10, 11), (11, 23))
    ]
    assert torch.allclose(torch.cat(pieces), expected, atol=1e-5)
    assert torch.equal(state, x[-(kernel - 1) :].T)


def float64_loop(q, k, v, decay, beta, state) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence written out per head and token in float64 (the oracle of both forms)."""
    q, k, v, decay, beta, s = (t.double().numpy() for t in (q, k, v, decay, beta, state.clone()))
    out = np.zeros(v.shape)
    for h in range(q.shape[1]):
        for t in range(q.shape[0]):
            s[h] *= np.exp(decay[t, h])
            s[h] += np.outer(k[t, h], beta[t, h] * (v[t, h] - k[t, h] @ s[h]))
            out[t, h] = q[t, h] @ s[h]
    return torch.from_numpy(out), torch.from_numpy(s)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def test_both_forms_keep_float32_accuracy_under_strong_decay():
    """Synth files' gates reach g = -50 beside mild ones: a chunk's cumulative decay reaches -1000s, and
    decays taken as differences of those sums kept only their absolute precision (measured 6.6e-6 relative
    off the float64 loop here; segment sums: 1e-7, the recurrent form's error)."""
    g = torch.Generator().manual_seed(11)
    n_tokens = 150
    q, k, v, _, beta, state = inputs(n_tokens, 11)
    k = F.normalize(k + 1.5, dim=-1)  # aligned keys: a badly conditioned chunk system
    strong = torch.rand(n_tokens, H, generator=g) < 0.5
    decay = torch.where(
        strong, -50 * torch.rand(n_tokens, H, generator=g), -0.05 * torch.rand(n_tokens, H, generator=g)
    )
    want, want_state = float64_loop(q, k, v, decay, beta, state)
    for form in (recurrent_delta_rule, chunked_delta_rule):
        got_state = state.clone()
        got = form(q, k, v, decay, beta, got_state)
        assert relative_error(got, want) < 1e-6, form.__name__
        assert relative_error(got_state, want_state) < 1e-6, form.__name__

"""The "gated_delta_rule" op (Gated DeltaNet linear attention): torch reference, any device.

Per value head a state S [key_dim, value_dim]; per token t with log-decay g_t <= 0 and write strength
beta_t in (0, 1):

    S <- exp(g_t) S;    S <- S + k_t (beta_t (v_t - S^T k_t))^T;    o_t = S^T q_t

Two forms of the same recurrence. `recurrent_delta_rule` steps token by token (decode). `chunked_delta_rule`
(prefill) solves the updates inside a chunk of CHUNK tokens at once as one unit-lower-triangular system
(the WY/UT form of Yang et al., "Gated Delta Networks", 2024), so only the chunk boundaries are sequential.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gufo.kernels.contracts import GATED_DELTA_RULE, DeltaGates, DeltaRuleKernel, restart_state
from gufo.kernels.registry import REFERENCE_BACKEND, Registration

CHUNK = 64


def recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """q, k: [T, H, Dk]; v: [T, H, Dv]; g, beta: [T, H]; state: [H, Dk, Dv], advanced in place.

    Returns the outputs [T, H, Dv]. Every update is in place: a token's step then allocates no
    state-sized temporaries (on the CPU a third of its time)."""
    outputs = []
    for t in range(q.shape[0]):
        state.mul_(g[t].exp()[:, None, None])
        remembered = (k[t][:, None, :] @ state)[:, 0]  # S^T k: what the state already returns for k
        correction = (v[t] - remembered) * beta[t][:, None]
        state.baddbmm_(k[t][:, :, None], correction[:, None, :])
        outputs.append((q[t][:, None, :] @ state)[:, 0])
    return torch.stack(outputs)


def _chunks(x: torch.Tensor, pad: int, chunk: int) -> torch.Tensor:
    """[T, H, ...] -> [H, T / chunk, chunk, ...], zero-padded at the end."""
    x = x.transpose(0, 1)
    x = F.pad(x, (0, 0, 0, pad)) if x.dim() == 3 else F.pad(x, (0, pad))
    return x.reshape(x.shape[0], -1, chunk, *x.shape[2:])


def segment_log_decays(g: torch.Tensor) -> torch.Tensor:
    """g [..., C] -> L [..., C, C] with L[i, j] = g_{j+1} + ... + g_i for j <= i (0 on the diagonal) and
    -inf above it, so exp(L) is the decay from token j to token i.

    Each L[i, j] is its own running sum from j + 1, never a difference c_i - c_j of cumulative sums: with
    strong gates (synth files reach g = -50, c = -3000 in a chunk) that difference keeps only the absolute
    precision of c, and a decay between neighbours whose own gates are mild comes out ~1e-4 off."""
    chunk = g.shape[-1]
    after = torch.ones(chunk, chunk, dtype=torch.bool, device=g.device).tril(-1)  # token t after column j
    sums = g[..., :, None].expand(*g.shape, chunk).masked_fill(~after, 0.0).cumsum(-2)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=g.device).tril()
    return sums.masked_fill(~causal, float("-inf"))


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """Same arguments and result as `recurrent_delta_rule`.

    In a chunk with cumulative log-decay c_i = g_1 + ... + g_i and S0 the state before it, the
    corrections u_i = beta_i (v_i - exp(c_i) S0^T k_i - sum_{j<i} exp(c_i - c_j) (k_i.k_j) u_j) form the
    system (I + A) U = beta V - beta exp(c) K S0 with A strictly lower triangular. The decays c_i - c_j
    are segment sums (`segment_log_decays`); every exponent is <= 0. Padding tokens (k = 0, beta = 0,
    g = 0) change nothing, so a length that is not a multiple of the chunk is exact."""
    n_tokens, n_heads = q.shape[:2]
    pad = (-n_tokens) % chunk
    q, k, v, g, beta = (_chunks(x, pad, chunk) for x in (q, k, v, g, beta))  # [H, N, C, ...]
    c = g.cumsum(-1)  # one-signed sums from the chunk's start: no cancellation
    log_decay = segment_log_decays(g)
    decay = log_decay.exp()
    system = ((k @ k.transpose(-1, -2)) * decay * beta[..., :, None]).tril(-1)
    system = system + torch.eye(chunk, dtype=q.dtype, device=q.device)
    solve = torch.linalg.solve_triangular
    values = solve(system, v * beta[..., None], upper=False, unitriangular=True)
    state_keys = solve(system, k * (beta * c.exp())[..., None], upper=False, unitriangular=True)
    scores = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * c.exp()[..., None]
    k_to_end = k * decay[..., -1, :, None]  # each token's write, decayed to the chunk's end
    chunk_decay = c[..., -1].exp()[..., None, None]
    s = state
    out = torch.empty_like(values)
    for n in range(q.shape[1]):
        u = values[:, n] - state_keys[:, n] @ s
        out[:, n] = q_decayed[:, n] @ s + scores[:, n] @ u
        s = s * chunk_decay[:, n] + k_to_end[:, n].transpose(-1, -2) @ u
    state.copy_(s)
    return out.reshape(n_heads, -1, out.shape[-1])[:, :n_tokens].transpose(0, 1)


def l2_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the mixer's q and k)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def scaled_queries_keys(
    q: torch.Tensor, k: torch.Tensor, scale: float, qk_norm_eps: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's q and k as the forms take them: L2-normalised first (qk_norm_eps), q times `scale`."""
    if qk_norm_eps is not None:
        q, k = l2_normalize(q, qk_norm_eps), l2_normalize(k, qk_norm_eps)
    return q * scale, k


def per_head_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    gates: DeltaGates | None,
    tiled_heads: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's q and k repeated to one per value head, and g and beta formed from their logits where
    `gates` (the op's contract, `DeltaRuleKernel`): the forms' q, k, g, beta."""
    per_key = v.shape[1] // q.shape[1]
    if per_key > 1:
        q, k = (t.repeat(1, per_key, 1) if tiled_heads else t.repeat_interleave(per_key, 1) for t in (q, k))
    if gates is not None:
        g, beta = gates.decay * F.softplus(g + gates.bias), torch.sigmoid(beta)
    return q, k, g, beta


class ReferenceGatedDeltaRule(DeltaRuleKernel):
    """One token: the recurrent form; more: the chunked form. q is multiplied by `scale` first. With
    `slots` each token is one decode step of its own sequence (token by token, over its slot's state)."""

    name = "torch-gated-delta-rule"

    @staticmethod
    def apply(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        scale: float,
        slots: torch.Tensor | None = None,
        qk_norm_eps: float | None = None,
        gates: DeltaGates | None = None,
        tiled_heads: bool = True,
        restart: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, g, beta = per_head_inputs(q, k, v, g, beta, gates, tiled_heads)
        q, k = scaled_queries_keys(q, k, scale, qk_norm_eps)
        if slots is not None:
            rows = [
                recurrent_delta_rule(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1],
                                     beta[t : t + 1], state[s])
                for t, s in enumerate(slots.tolist())
            ]  # fmt: skip
            return torch.cat(rows) if rows else torch.empty_like(v)
        restart_state(state, restart)
        form = recurrent_delta_rule if q.shape[0] == 1 else chunked_delta_rule
        return form(q, k, v, g, beta, state)


KERNELS = (Registration(REFERENCE_BACKEND, GATED_DELTA_RULE, ReferenceGatedDeltaRule()),)

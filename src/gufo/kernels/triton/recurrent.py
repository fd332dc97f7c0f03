"""Decode steps of the recurrent (Gated DeltaNet) layers: the causal conv's window update and the gated
delta rule, one token per row, each row over its own slot's state.

A row's program reads only its token and its slot's state, so a step of several sequences gives each row
the numbers of its own one-row step (the row's slot only offsets its state; a single sequence's step
runs the same arithmetic on the one slot it is given). Several tokens of one sequence (prefill) run the
torch reference (the conv's sums are the decode step's, bit for bit); the delta rule's run either a
chunked form, which solves a chunk at once, the torch reference's or fla-core's (`KernelOptions.
delta_rule_prefill`, `gufo.kernels.fla_delta_rule`), or ("recurrent") the decode step's own arithmetic
token after token in one launch, the state held in registers, so prefill and decode agree bit for bit.
Registered on the "cuda" backend beside the references (`gufo.kernels.causal_conv`,
`gufo.kernels.delta_rule`), their test oracles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gufo.kernels import delta_rule, fla_delta_rule
from gufo.kernels.causal_conv import ReferenceCausalConv1d
from gufo.kernels.contracts import (
    CAUSAL_CONV1D,
    GATED_DELTA_RULE,
    CausalConvKernel,
    DeltaGates,
    DeltaRuleKernel,
    restart_state,
)
from gufo.kernels.registry import Registration
from gufo.kernels.triton.checks import check_device, check_dims, check_dtype, check_size
from gufo.kernels.triton.dependent_launch import DependentLaunch, LaunchedKernel, wait_for_inputs
from gufo.options import KernelOptions

# KernelOptions.delta_rule_prefill -> the chunked form (delta_rule.chunked_delta_rule's contract)
PREFILL_FORMS = {"torch": delta_rule.chunked_delta_rule, "fla": fla_delta_rule.chunked_delta_rule}

CONV_BLOCK = 512  # channels per program of the conv update
VALUE_BLOCK = 16  # value columns per program of the delta rule: a [key_dim, 16] tile (docs/decisions.md)
NUM_WARPS = 4


@triton.jit
def causal_conv_step(
    x_ptr, state_ptr, w_ptr, slot_ptr, restart_ptr, out_ptr, C, stride_xt, stride_ss, stride_sc,
    W: tl.constexpr, SLOTS: tl.constexpr, RESTART: tl.constexpr, BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """Per (token, BLOCK_C channels): out = sum_j w[:, j] window[:, j] over the window [state, x] (W taps,
    summed in tap order as the reference does), and the state's W - 1 columns shifted by one. The state
    is slot slot_ptr[token]'s (SLOTS), else the one slot given; with RESTART it counts as zeros (unread)
    where restart_ptr[0], the position, is 0."""
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = c < C
    state_mask = mask
    if SLOTS:
        state_ptr += tl.load(slot_ptr + token) * stride_ss
    if RESTART:
        state_mask = mask & (tl.load(restart_ptr) != 0)
    column = state_ptr + c * stride_sc
    x = tl.load(x_ptr + token * stride_xt + c, mask=mask, other=0.0).to(tl.float32)
    w_row = w_ptr + c * W
    for j in tl.static_range(W):
        tap = tl.load(column + j, mask=state_mask, other=0.0) if j < W - 1 else x
        if j == 0:
            out = tap * tl.load(w_row, mask=mask, other=0.0)
        else:
            out = out + tap * tl.load(w_row + j, mask=mask, other=0.0)
            tl.store(column + j - 1, tap, mask=mask)  # column j - 1 was read at tap j - 1
    tl.store(out_ptr + token * C + c, out, mask=mask)


@triton.jit(do_not_specialize=["steps"])
def gated_delta_rule_step(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, decay_ptr, bias_ptr, state_ptr, slot_ptr, restart_ptr, out_ptr,
    H, KH, DK, DV, steps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_bt,
    stride_ss, stride_sh, stride_sk, scale, eps,
    NORM: tl.constexpr, GATES: tl.constexpr, TILED: tl.constexpr, SLOTS: tl.constexpr,
    RESTART: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Per (row, head, BLOCK_V value columns), `steps` decode steps of the row's tokens row * steps, ...:
    S <- exp(g) S, then S <- S + k (beta (v - S^T k))^T, out = S^T (scale q), on the columns' [DK,
    BLOCK_V] tile of the state (each column's update reads only that column), held in registers between
    the steps. q and k have KH heads: value head h reads key head h % KH (TILED), else h // (H / KH); L2-
    normalised first (NORM). With GATES g and beta are logits: g = decay * softplus(g + bias), beta =
    sigmoid(beta) (`contracts.DeltaGates`). The state is slot slot_ptr[row]'s (SLOTS: one step per row),
    else the one slot given; with RESTART it counts as zeros (unread) where restart_ptr[0], the position,
    is 0. Launched without fused multiply-adds, so a step's numbers are the same whatever the number of
    steps."""
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    key_head = head % KH if TILED else head // (H // KH)
    dk = tl.arange(0, BLOCK_K)
    dv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask, v_mask = dk < DK, dv < DV
    if SLOTS:
        state_ptr += tl.load(slot_ptr + row) * stride_ss
    tile = state_ptr + head * stride_sh + dk[:, None] * stride_sk + dv[None, :]
    tile_mask = k_mask[:, None] & v_mask[None, :]
    if RESTART:
        s = tl.load(tile, mask=tile_mask & (tl.load(restart_ptr) != 0), other=0.0)
    else:
        s = tl.load(tile, mask=tile_mask, other=0.0)
    if GATES:
        decay, bias = tl.load(decay_ptr + head).to(tl.float32), tl.load(bias_ptr + head).to(tl.float32)
    for step in range(steps):
        token = row * steps + step
        q_row, k_row = (
            q_ptr + token * stride_qt + key_head * stride_qh,
            k_ptr + token * stride_kt + key_head * stride_kh,
        )
        q = tl.load(q_row + dk, mask=k_mask, other=0.0).to(tl.float32)
        k = tl.load(k_row + dk, mask=k_mask, other=0.0).to(tl.float32)
        if NORM:
            q = q / tl.sqrt(tl.sum(q * q, axis=0) + eps)
            k = k / tl.sqrt(tl.sum(k * k, axis=0) + eps)
        q = q * scale
        v = tl.load(v_ptr + token * stride_vt + head * stride_vh + dv, mask=v_mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + token * stride_gt + head).to(tl.float32)
        beta = tl.load(beta_ptr + token * stride_bt + head).to(tl.float32)
        if GATES:  # torch's softplus: x itself above 20
            g = g + bias
            g = decay * tl.where(g > 20.0, g, tl.log(1.0 + tl.exp(g)))
            beta = tl.sigmoid(beta)
        s = s * tl.exp(g)
        remembered = tl.sum(k[:, None] * s, axis=0)  # S^T k: what the state already returns for k
        s = s + k[:, None] * ((v - remembered) * beta)[None, :]
        tl.store(out_ptr + (token * H + head) * DV + dv, tl.sum(q[:, None] * s, axis=0), mask=v_mask)
    tl.store(tile, s, mask=tile_mask)


def _slot_args(
    state: torch.Tensor, slots: torch.Tensor | None, n_tokens: int, dims: int, unread: torch.Tensor
) -> tuple:
    """(slot pointer, slot stride, one slot's state) of a launch: with `slots` ([T] int64) state is a
    layer's [slots, ...] (dims + 1 dimensions), else one slot's (dims) and the pointer `unread`, an
    input the kernel only reads (the interpreter writes every tensor argument back)."""
    check_dims("state", state, dims if slots is None else dims + 1)
    check_dtype("state", state, (torch.float32,))
    if slots is None:
        return unread, 0, state
    check_device("slots", slots, state.device)
    check_dtype("slots", slots, (torch.int64,))
    check_size("slots entries (one per token)", slots.numel(), n_tokens)
    return slots, state.stride(0), state[0]


def _restart_arg(
    restart: torch.Tensor | None, slots: torch.Tensor | None, state: torch.Tensor, unread: torch.Tensor
) -> tuple:
    """(restart pointer, RESTART) of a launch (`contracts.restart_state`; one slot's pass only); without
    a restart the pointer is `unread`, as in `_slot_args`."""
    if restart is None:
        return unread, False
    if slots is not None:
        raise ValueError("restart: a step of several slots' rows starts none (their caller clears them)")
    check_device("restart", restart, state.device)
    check_dtype("restart", restart, (torch.int64,))
    check_size("restart entries", restart.numel(), 1)
    return restart, True


class TritonCausalConv1d(LaunchedKernel, CausalConvKernel):
    name = "triton-causal-conv1d"

    def apply(
        self,
        x: torch.Tensor,
        state: torch.Tensor,
        weight: torch.Tensor,
        slots: torch.Tensor | None = None,
        restart: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The reference's contract (`gufo.kernels.causal_conv`), one launch for tokens of distinct
        sequences (or a lone token); bit for bit the reference's sums (no fused multiply-adds)."""
        if slots is None and x.shape[0] != 1:
            return ReferenceCausalConv1d.apply(x, state, weight, None, restart)
        check_dims("x", x, 2)
        slot_ptr, slot_stride, one = _slot_args(state, slots, x.shape[0], 2, weight)
        restart_ptr, restarts = _restart_arg(restart, slots, state, weight)
        channels, width = weight.shape
        check_size("state channels", one.shape[0], channels)
        check_size("state columns (kernel - 1)", one.shape[1], width - 1)
        check_size("x channels", x.shape[1], channels)
        for what, tensor in (("weight", weight), ("state", state)):
            check_device(what, tensor, x.device)
        if x.stride(-1) != 1:
            x = x.contiguous()
        if one.stride(-1) != 1 or not weight.is_contiguous():
            raise ValueError("causal conv: state rows and weight must be contiguous")
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        if x.shape[0]:
            causal_conv_step[(x.shape[0], triton.cdiv(channels, CONV_BLOCK))](
                x, state, weight, slot_ptr, restart_ptr, out, channels, x.stride(0), slot_stride,
                one.stride(0), W=width, SLOTS=slots is not None, RESTART=restarts, BLOCK_C=CONV_BLOCK,
                num_warps=NUM_WARPS,
                enable_fp_fusion=False, **self.launch.options(x.device),
            )  # fmt: skip
        return out


class TritonGatedDeltaRule(LaunchedKernel, DeltaRuleKernel):
    """Several tokens of one sequence (prefill) run the chunked form `prefill` names (PREFILL_FORMS), or
    with prefill "recurrent" one launch of the decode step's arithmetic, token after token."""

    name = "triton-gated-delta-rule"

    def __init__(self, launch: DependentLaunch, prefill: str = "torch"):
        super().__init__(launch)
        self.chunked = PREFILL_FORMS.get(prefill)  # None: "recurrent", the step kernel over the tokens

    def apply(
        self,
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
        """The reference's contract (`gufo.kernels.delta_rule`), one launch for tokens of distinct
        sequences, a lone token or (prefill "recurrent") the tokens of one: q, k [T, Hk, Dk], v [T, H,
        Dv], g, beta [T, H] -> [T, H, Dv] float32; the gates and the key head of each value head formed
        in the kernel."""
        one_sequence = slots is None and q.shape[0] != 1
        if one_sequence and self.chunked is not None:
            q, k, g, beta = delta_rule.per_head_inputs(q, k, v, g, beta, gates, tiled_heads)
            q, k = delta_rule.scaled_queries_keys(q, k, scale, qk_norm_eps)
            restart_state(state, restart)
            return self.chunked(q, k, v, g, beta, state)
        slot_ptr, slot_stride, one = _slot_args(state, slots, q.shape[0], 3, v)
        restart_ptr, restarts = _restart_arg(restart, slots, state, v)
        n_tokens, key_heads, key_dim = q.shape
        n_heads, value_dim = v.shape[1:]
        if n_heads % max(key_heads, 1):
            raise ValueError(f"q: {key_heads} heads do not divide v's {n_heads}")
        per_head = (n_heads,)
        for what, tensor, shape in (
            ("k", k, q.shape),
            ("v", v, (n_tokens, n_heads, one.shape[-1])),
            ("g", g, (n_tokens, n_heads)),
            ("beta", beta, (n_tokens, n_heads)),
            ("state", one, (n_heads, key_dim, value_dim)),
            *(
                (("gates.decay", gates.decay, per_head), ("gates.bias", gates.bias, per_head))
                if gates
                else ()
            ),
        ):
            if tuple(tensor.shape) != tuple(shape):
                raise ValueError(f"{what}: shape {tuple(tensor.shape)}, expected {tuple(shape)}")
            check_device(what, tensor, q.device)
        if one.stride(-1) != 1:
            raise ValueError("delta rule: state rows must be contiguous")
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        g, beta = (t if t.stride(-1) == 1 else t.contiguous() for t in (g, beta))
        decay, bias = (gates.decay.contiguous(), gates.bias.contiguous()) if gates else (v, v)
        out = torch.empty(n_tokens, n_heads, value_dim, dtype=torch.float32, device=q.device)
        if n_tokens:
            block_v = min(VALUE_BLOCK, triton.next_power_of_2(value_dim))
            rows, steps = (1, n_tokens) if one_sequence else (n_tokens, 1)
            gated_delta_rule_step[(rows, n_heads, triton.cdiv(value_dim, block_v))](
                q, k, v, g, beta, decay, bias, state, slot_ptr, restart_ptr, out, n_heads, key_heads,
                key_dim, value_dim, steps, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
                v.stride(1), g.stride(0), beta.stride(0), slot_stride, one.stride(0), one.stride(1), scale,
                qk_norm_eps or 0.0, NORM=qk_norm_eps is not None, GATES=gates is not None,
                TILED=tiled_heads, SLOTS=slots is not None, RESTART=restarts,
                BLOCK_K=triton.next_power_of_2(key_dim), BLOCK_V=block_v, num_warps=NUM_WARPS,
                enable_fp_fusion=False, **self.launch.options(q.device),
            )  # fmt: skip
        return out


def registrations(launch: DependentLaunch, options: KernelOptions) -> tuple[Registration, ...]:
    delta = TritonGatedDeltaRule(launch, prefill=options.delta_rule_prefill)
    return (
        Registration("cuda", CAUSAL_CONV1D, TritonCausalConv1d(launch)),
        Registration("cuda", GATED_DELTA_RULE, delta),
    )

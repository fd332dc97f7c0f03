"""The gated delta rule's chunked (prefill) form by fla-core's Triton kernels (`KernelOptions.
delta_rule_prefill` "fla"; docs/decisions.md, "Gated delta rule prefill").

`chunked_delta_rule` has the contract of `gufo.kernels.delta_rule.chunked_delta_rule`: q already scaled
and L2-normalised by the caller (gufo's own l2norm, whose eps is the model's; fla's in-kernel l2norm has
eps fixed at 1e-6), q and k one per value head (the model's own head order, not fla's grouped one), the
state [H, Dk, Dv] float32 advanced in place. fla is imported at the first call, so gufo runs without it.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from torch import Tensor

from gufo.errors import BadInputError
from gufo.options import FLA_MISSING


@cache
def _fla_chunk() -> Callable[..., tuple[Tensor, Tensor]]:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as err:
        raise BadInputError(FLA_MISSING.format(f"does not import ({err})")) from None
    return chunk_gated_delta_rule


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> Tensor:
    """q, k: [T, H, Dk]; v: [T, H, Dv]; g (log-decay), beta: [T, H]; state: [H, Dk, Dv] float32,
    advanced in place. Returns the outputs [T, H, Dv] in v's dtype.

    fla takes a batch of one sequence ([1, T, ...]), applies `scale` itself (1: q comes scaled) and
    returns a new final state in the same [H, K, V] layout as ours (state_v_first False)."""
    out, final = _fla_chunk()(
        q[None],
        k[None],
        v[None],
        g[None],
        beta[None],
        scale=1.0,
        initial_state=state[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
    )
    state.copy_(final[0])
    return out[0]

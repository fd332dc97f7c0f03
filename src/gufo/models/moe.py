"""Mixture-of-experts FFN (llama.cpp's layout): a softmax router over every expert, the top-k routed
SwiGLU experts weighted by their (optionally renormalised) probabilities, and an optional shared expert
scaled per token by sigmoid(ffn_gate_inp_shexp . x).

Expert weights are 3-D GGUF tensors ([n_expert, rows, cols] in torch order). Where the backend has its
own "expert_linear" kernel for their block format, routing stays on the device: a decode step's products
read the chosen experts in place by their device-side ids (no host read: captured in a CUDA graph), and
prefill sorts the token-expert assignments by expert on the device (kernels.expert_groups) for one grouped
product per matrix.
Elsewhere each expert is its own `Linear` (the backend's kernel for any matrix) and every pass groups
the assignments the same way, reading the per-expert counts on the host. On a backend that uploads the
experts, a shared expert shaped like them joins the stacks as expert n, so a decode step runs it as one
more gathered assignment per token (`joinable`; docs/decisions.md says why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile, TensorInfo
from gufo.kernels import registry
from gufo.kernels.contracts import EXPERT_LINEAR, GATED_ACT, MOE_COMBINE, MOE_ROUTE
from gufo.kernels.expert_groups import (
    ExpertGroups,
    group_assignments,
    per_expert,
    tile_rows,
)
from gufo.models.base import GatedFFN
from gufo.models.layers import Linear


@dataclass(frozen=True)
class MoEShape:
    n_experts: int
    n_used: int
    expert_ff: int
    norm_top_k: bool  # renormalise the chosen experts' probabilities to sum to 1

    @classmethod
    def from_file(cls, mf: ModelFile, norm_default: bool = True) -> MoEShape:
        n, k = int(mf.arch_key("expert_count")), int(mf.arch_key("expert_used_count"))
        if not 0 < k <= n:
            raise BadInputError(f"{mf.label}: expert_used_count {k} must be in 1..expert_count {n}")
        norm = bool(mf.arch_key("expert_weights_norm", norm_default))
        return cls(n, k, int(mf.arch_key("expert_feed_forward_length")), norm)


def expert_tensor(mf: ModelFile, name: str, rows: int, cols: int, n_experts: int) -> TensorInfo:
    """A 3-D expert tensor, checked to be [n_experts, rows, cols]."""
    info = mf.tensor(name)
    if tuple(info.shape) != (n_experts, rows, cols):
        raise BadInputError(
            f"{mf.label}: tensor {name} has shape {list(info.shape)}, expected {[n_experts, rows, cols]}"
        )
    return info


def stacked_experts(parts: list[TensorInfo], extra: list[TensorInfo] | None = None) -> TensorInfo:
    """Expert tensors of one block format as one, each expert's rows of the parts one after another
    (separate gate and up tensors as the fused gate_up one); with `extra`, one more expert after the
    others made of those 2-D tensors' rows (the shared expert's gate and up; its down). One copy."""
    n, _, cols = parts[0].shape
    rows = sum(part.shape[1] for part in parts)
    row_bytes = parts[0].data.shape[-1]
    data = np.empty((n + (extra is not None), rows, row_bytes), dtype=parts[0].data.dtype)
    at = 0
    for part in parts:
        data[:n, at : at + part.shape[1]] = part.data
        at += part.shape[1]
    if extra is not None:
        data[n] = np.concatenate([info.data.reshape(-1, row_bytes) for info in extra])
    name = "+".join(info.name for info in (*parts, *(extra or ())))
    return TensorInfo(name, parts[0].qtype, (len(data), rows, cols), -1, data.nbytes, data)


def joinable_assignments(backend: str, qtype: Any) -> int:
    """How many assignments one gathered product of the backend's own expert kernel takes for this
    block format, where that kernel copies the weights anyway (0: none, or the tensor stays mapped)."""
    found = registry.find(backend, EXPERT_LINEAR, qtype)
    own = found is not None and found[0] == backend and found[1].copies_weights
    return found[1].max_assignments if own else 0


def joinable(
    gate_up: list[TensorInfo], down: TensorInfo, shared: list[TensorInfo], backend: str, assignments: int
) -> bool:
    """Whether the shared expert (its gate, up and down matrices) can run as one more routed expert in a
    decode step's gathered products: shaped and typed like the routed experts (their gate and up rows of
    one block format), on a backend whose expert kernel gathers `assignments` (a token's chosen experts
    and the shared one)."""
    if len({part.qtype for part in gate_up}) != 1:
        return False
    rows, cols = sum(part.shape[1] for part in gate_up), gate_up[0].shape[2]
    gate, up, down_rows = shared
    return (
        tuple(gate.shape) == tuple(up.shape) == (rows // 2, cols)
        and tuple(down_rows.shape) == tuple(down.shape[1:])
        and gate.qtype == up.qtype == gate_up[0].qtype
        and down_rows.qtype == down.qtype
        and min(joinable_assignments(backend, gate_up[0].qtype), joinable_assignments(backend, down.qtype))
        >= assignments
    )


def as_matrix(mf: ModelFile, name: str, cols: int) -> TensorInfo:
    """A one-row weight (a per-token scalar gate) as [1, cols], whether stored 1-D or 2-D."""
    info = mf.tensor(name)
    if info.n_elements != cols or info.shape[-1] != cols:
        raise BadInputError(f"{mf.label}: tensor {name} has shape {list(info.shape)}, expected [{cols}]")
    return TensorInfo(info.name, info.qtype, (1, cols), info.offset, info.n_bytes, info.data.reshape(1, -1))


class ExpertMatrices:
    """The products of one 3-D expert tensor: by the backend's own expert kernel (`device_routed`),
    else by one `Linear` per expert (views of the tensor's slices, no copy)."""

    def __init__(self, info: TensorInfo, backend: str):
        found = registry.find(backend, EXPERT_LINEAR, info.qtype)
        self.device_routed = found is not None and found[0] == backend
        self.qtype = info.qtype
        self.kernel: Any = None
        if self.device_routed:
            self.kernel = found[1]
            self.weight = self.kernel.prepare(info)
            self.max_assignments = self.kernel.max_assignments
            self.route = f"{backend}:{self.kernel.name}"
            return
        self.max_assignments = 0
        n, rows, cols = info.shape
        slices = (
            TensorInfo(f"{info.name}[{e}]", info.qtype, (rows, cols), -1, info.data[e].nbytes, info.data[e])
            for e in range(n)
        )
        self.experts = [Linear.of([expert], backend) for expert in slices]
        self.route = f"{self.experts[0].route}:{self.experts[0].kernel.name} (one product per expert)"

    def gathered(self, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x [A or 1, cols] through experts [A] (ids on the device) -> [A, rows]; `device_routed` only."""
        return self.kernel.gathered(x, self.weight, experts)

    def grouped(self, x: torch.Tensor, groups: ExpertGroups) -> torch.Tensor:
        """x [A, cols] sorted by expert as `groups` orders the assignments -> [A, rows]."""
        if self.device_routed:
            return self.kernel.grouped(x, self.weight, groups)
        parts = [self.experts[e](part) for e, part in per_expert(x, groups)]
        return torch.cat(parts)


class MoEFFN:
    def __init__(self, mf: ModelFile, prefix: str, n_embd: int, shape: MoEShape, backend: str):
        self.shape = shape
        router = mf.tensor(f"{prefix}.ffn_gate_inp.weight")
        if tuple(router.shape) != (shape.n_experts, n_embd):
            raise BadInputError(
                f"{mf.label}: tensor {router.name} has shape {list(router.shape)}, "
                f"expected {[shape.n_experts, n_embd]}"
            )
        ff, n = shape.expert_ff, shape.n_experts
        fused = f"{prefix}.ffn_gate_up_exps.weight"  # the converter's --fuse-gate-up-exps: gate rows, then up
        if fused in mf.tensors:
            parts = [expert_tensor(mf, fused, 2 * ff, n_embd, n)]
        else:
            parts = [
                expert_tensor(mf, f"{prefix}.ffn_{name}_exps.weight", ff, n_embd, n)
                for name in ("gate", "up")
            ]
        down = expert_tensor(mf, f"{prefix}.ffn_down_exps.weight", n_embd, ff, n)
        self.shared: GatedFFN | None = None
        self.shared_gate: Linear | None = None  # the shared expert's gate, where the router's rows lack it
        routers = [router]
        self.shared_joins = False  # the shared expert is expert n of the decode's gathered products
        if f"{prefix}.ffn_up_shexp.weight" in mf.tensors:
            self.shared = GatedFFN(mf, prefix, backend, "silu", suffix="_shexp")
            gate_inp = as_matrix(mf, f"{prefix}.ffn_gate_inp_shexp.weight", n_embd)
            if gate_inp.qtype == router.qtype:  # one product: the router's rows, then the gate's row
                routers.append(gate_inp)
            else:
                self.shared_gate = Linear.of([gate_inp], backend)
            shared = [mf.tensor(f"{prefix}.ffn_{name}_shexp.weight") for name in ("gate", "up", "down")]
            self.shared_joins = joinable(parts, down, shared, backend, shape.n_used + 1)
        if self.shared_joins:
            parts, down = [stacked_experts(parts, shared[:2])], stacked_experts([down], shared[2:])
        elif len(parts) > 1 and parts[0].qtype == parts[1].qtype:
            parts = [stacked_experts(parts)]
        self.router = Linear.of(routers, backend)
        # one product for each expert's gate and up rows where they share a block format
        self.gate_up = [ExpertMatrices(info, backend) for info in parts]
        self.down = ExpertMatrices(down, backend)
        # most token-expert assignments a pass gathers on the device (0: every pass groups them)
        self.max_gathered = min(m.max_assignments for m in (*self.gate_up, self.down))
        self.activation = registry.lookup(backend, GATED_ACT)[1]
        self.route = registry.lookup(backend, MOE_ROUTE)[1]
        self.combine = registry.lookup(backend, MOE_COMBINE)[1]

    @property
    def device_routed(self) -> bool:
        """Whether a decode step reads no routing value on the host (CUDA graph capture)."""
        return self.max_gathered >= self.shape.n_used

    def takes_int8(self, rows: int) -> bool:
        """The router reads float rows."""
        return False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.router(x)
        n, k, tokens = self.shape.n_experts, self.shape.n_used, x.shape[0]
        joined = self.shared_joins and tokens * (k + 1) <= self.max_gathered
        extra = n if joined else None
        weights, chosen = self.route.apply(logits[:, :n], k, self.shape.norm_top_k, extra)
        if self.shared is None:
            y = self._gathered(x, chosen) if chosen.numel() <= self.max_gathered else self._grouped(x, chosen)
            return self.combine.apply(y, weights).to(x.dtype)
        gate = logits[:, n:] if self.shared_gate is None else self.shared_gate(x)
        if joined:  # the shared expert's rows come with the routed ones, in each token's last slot
            y = self._gathered(x, chosen).view(tokens, k + 1, -1)
            return self.combine.apply(y[:, :k], weights, y[:, k], gate).to(x.dtype)
        y = self._gathered(x, chosen) if chosen.numel() <= self.max_gathered else self._grouped(x, chosen)
        return self.combine.apply(y, weights, self.shared(x), gate).to(x.dtype)

    def _experts(self, rows: torch.Tensor, product: Any) -> torch.Tensor:
        ff = self.shape.expert_ff
        outputs = [product(matrices, rows) for matrices in self.gate_up]
        gate, up = (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)).split([ff, ff], dim=-1)
        return product(self.down, self.activation.apply(gate, up, "silu"))  # strided halves: no copies

    def _gathered(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """A few tokens (decode): one product per matrix over every assignment, each reading its expert
        by the device-side id; the results per assignment, token-major."""
        t, k = chosen.shape
        experts = chosen.reshape(-1)
        rows = x if t == 1 else x[:, None].expand(t, k, -1).reshape(t * k, -1)  # one token: one row for all
        return self._experts(rows, lambda matrices, h: matrices.gathered(h, experts))

    def _grouped(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        """The token-expert assignments sorted by expert on the device (expert_groups), one grouped
        product per matrix over them; the results put back per assignment, token-major."""
        n = self.shape.n_experts
        groups = group_assignments(chosen, n, tile_rows(chosen.numel(), n))
        y = self._experts(x[groups.tokens], lambda matrices, h: matrices.grouped(h, groups))
        return y[groups.inverse]


class RoutedFFNs:
    """Mixin of a hybrid Qwen model (qwen35's `feed_forward` hook): a block with `ffn_gate_inp` is a
    mixture of experts, one without it the dense SwiGLU; CUDA graphs capture the decode step where every
    expert block routes on the device."""

    layers: list[Any]
    every_block_routed = False  # a block without a router is refused (required tensor) instead of dense

    def __init__(self, mf: ModelFile, backend: str):
        self.moe_shape = MoEShape.from_file(mf)  # read first: the base constructor builds the blocks
        super().__init__(mf, backend)  # type: ignore[call-arg]

    def feed_forward(self, mf: ModelFile, prefix: str, backend: str) -> MoEFFN | None:
        if f"{prefix}.ffn_gate_inp.weight" not in mf.tensors and not self.every_block_routed:
            return None
        return MoEFFN(mf, prefix, self.config.n_embd, self.moe_shape, backend)  # type: ignore[attr-defined]

    @property
    def graph_capturable(self) -> bool:
        return all(ffn.device_routed for ffn in self._expert_ffns())

    def routes(self) -> dict[str, str]:
        """As `DecoderModel.routes`, with the expert products' kernel per block format."""
        found: dict[str, str] = super().routes()  # type: ignore[misc]
        for ffn in self._expert_ffns():
            for matrices in (*ffn.gate_up, ffn.down):
                found.setdefault(f"expert_linear.{matrices.qtype.name}", matrices.route)
        return found

    def _expert_ffns(self) -> list[MoEFFN]:
        return [layer.ffn for layer in self.layers if isinstance(layer.ffn, MoEFFN)]

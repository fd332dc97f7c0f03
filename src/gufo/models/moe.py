"""Mixture-of-experts FFN (llama.cpp's layout): a softmax router over every expert, the top-k routed
SwiGLU experts weighted by their (optionally renormalised) probabilities, and an optional shared expert
scaled per token by sigmoid(ffn_gate_inp_shexp . x).

Expert weights are 3-D GGUF tensors ([n_expert, rows, cols] in torch order); each expert is its slice,
kept in the block format and kernel the backend picks for any other matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile, TensorInfo
from gufo.models.base import GatedFFN
from gufo.models.layers import FusedLinear, Linear


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


def expert_slices(mf: ModelFile, name: str, rows: int, cols: int, n_experts: int) -> list[TensorInfo]:
    """Per-expert views of a 3-D expert tensor (no copy), checked to be [n_experts, rows, cols]."""
    info = mf.tensor(name)
    if tuple(info.shape) != (n_experts, rows, cols):
        raise BadInputError(
            f"{mf.label}: tensor {name} has shape {list(info.shape)}, expected {[n_experts, rows, cols]}"
        )
    return [
        TensorInfo(f"{name}[{e}]", info.qtype, (rows, cols), -1, info.data[e].nbytes, info.data[e])
        for e in range(n_experts)
    ]


def as_matrix(mf: ModelFile, name: str, cols: int) -> TensorInfo:
    """A one-row weight (a per-token scalar gate) as [1, cols], whether stored 1-D or 2-D."""
    info = mf.tensor(name)
    if info.n_elements != cols or info.shape[-1] != cols:
        raise BadInputError(f"{mf.label}: tensor {name} has shape {list(info.shape)}, expected [{cols}]")
    return TensorInfo(info.name, info.qtype, (1, cols), info.offset, info.n_bytes, info.data.reshape(1, -1))


class MoEFFN:
    def __init__(self, mf: ModelFile, prefix: str, n_embd: int, shape: MoEShape, backend: str):
        self.shape = shape
        router = mf.tensor(f"{prefix}.ffn_gate_inp.weight")
        if tuple(router.shape) != (shape.n_experts, n_embd):
            raise BadInputError(
                f"{mf.label}: tensor {router.name} has shape {list(router.shape)}, "
                f"expected {[shape.n_experts, n_embd]}"
            )
        self.router = Linear.of([router], backend)
        ff, n = shape.expert_ff, shape.n_experts
        fused = f"{prefix}.ffn_gate_up_exps.weight"  # the converter's --fuse-gate-up-exps: gate rows, then up
        if fused in mf.tensors:
            slices = expert_slices(mf, fused, 2 * ff, n_embd, n)
            gate_ups = [FusedLinear.stacked(info, [ff, ff], backend) for info in slices]
        else:
            gates = expert_slices(mf, f"{prefix}.ffn_gate_exps.weight", ff, n_embd, n)
            ups = expert_slices(mf, f"{prefix}.ffn_up_exps.weight", ff, n_embd, n)
            gate_ups = [FusedLinear.of([g, u], backend) for g, u in zip(gates, ups, strict=True)]
        downs = expert_slices(mf, f"{prefix}.ffn_down_exps.weight", n_embd, ff, n)
        self.experts = [GatedFFN.of(gu, d, backend, "silu") for gu, d in zip(gate_ups, downs, strict=True)]
        self.shared: GatedFFN | None = None
        if f"{prefix}.ffn_up_shexp.weight" in mf.tensors:
            self.shared = GatedFFN(mf, prefix, backend, "silu", suffix="_shexp")
            gate = as_matrix(mf, f"{prefix}.ffn_gate_inp_shexp.weight", n_embd)
            self.shared_gate = Linear.of([gate], backend)

    def takes_int8(self, rows: int) -> bool:
        """The router reads float rows."""
        return False

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x).float(), dim=-1)
        weights, chosen = probs.topk(self.shape.n_used, dim=-1)
        if self.shape.norm_top_k:
            weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        # only the experts some token chose run, each over its tokens (a host sync: no graph capture)
        for e in chosen.unique().tolist():
            tokens, rank = (chosen == e).nonzero(as_tuple=True)
            y = self.experts[e](x[tokens]) * weights[tokens, rank, None].to(x.dtype)
            out.index_add_(0, tokens, y)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        return out

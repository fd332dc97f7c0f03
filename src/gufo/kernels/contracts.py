"""What each registry op's kernels take, give and declare.

One `Protocol` per op; its capabilities are declared fields with the defaults every kernel of the op
inherits (kernels subclass the protocol), so callers read plain attributes instead of probing. An `Op`
constant names an op and carries its kernel type: `registry.lookup(backend, LINEAR, qtype)` is a
`LinearKernel`.

The decode layer kernel reads a layer as data (`LayerSpec`), built by the model: kernels never see the
model's classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from gufo.gguf.model_file import TensorInfo
from gufo.kernels.expert_groups import ExpertGroups
from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.kv_pages import KVPages
from gufo.kernels.positions import RowPositions, TokenPositions

KernelType = TypeVar("KernelType", covariant=True)


@dataclass(frozen=True)
class Op(Generic[KernelType]):
    """A registry op; its type parameter is the protocol its kernels follow."""

    name: str


class Kernel(Protocol):
    name: str

    def available(self) -> bool:
        """Whether the kernel can run here (a library built, a compiler found); else the registry falls
        back to the torch reference."""
        return True


class LinearKernel(Kernel, Protocol):
    # a row's result depends on that row alone, never on the other rows of the call (nor their number)
    batch_invariant: bool = False

    def prepare(self, info: TensorInfo) -> Any:
        """The weight as the kernel reads it (made once, at load)."""
        ...

    def apply(self, x: torch.Tensor | Int8Rows, weight: Any) -> torch.Tensor:
        """x @ W^T; `Int8Rows` only where `takes_int8(weight, rows)`."""
        ...

    def takes_int8(self, weight: Any, rows: int) -> bool:
        """Whether a product of `rows` rows may be given them as `Int8Rows` (the kernel that makes them
        then quantizes as it writes)."""
        return False

    def keeps_rows(self, weight: Any, rows: int) -> bool:
        """Whether a product of `rows` rows gives each row the numbers of its own one-row product."""
        return self.batch_invariant

    def packs_rows(self, weight: Any) -> bool:
        """Whether products of more rows than `keeps_rows` takes give each row the same numbers at any
        such row count, so that several sequences' prefill chunks may share one product."""
        return self.batch_invariant


class ExpertLinearKernel(Kernel, Protocol):
    """Products with one matrix per expert of a 3-D expert tensor [n_experts, rows, cols], the experts
    chosen on the device: a decode step reads no routing value on the host (graph capturable)."""

    # most assignments (rows of x) one `gathered` call takes
    max_assignments: int = 16
    # `prepare` copies the weights into a layout of its own (a GPU upload), so a tensor with one more
    # expert appended costs no memory of a mapped file (gufo.models.moe joins the shared expert so)
    copies_weights: bool = False

    def prepare(self, info: TensorInfo) -> Any:
        """The 3-D expert tensor as the kernel reads it (made once, at load)."""
        ...

    def gathered(self, x: torch.Tensor, weight: Any, experts: torch.Tensor) -> torch.Tensor:
        """experts [A] (int64, on the device) and x [A, cols] (row a for expert experts[a]) or [1, cols]
        (one row for all) -> [A, rows]: row a is x[a] @ W[experts[a]]^T."""
        ...

    def grouped(self, x: torch.Tensor, weight: Any, groups: ExpertGroups) -> torch.Tensor:
        """x [A, cols] sorted by expert as `groups` orders the assignments (groups.counts[e] rows for
        expert e) -> [A, rows]: row i is x[i] @ W[its expert]^T."""
        ...


class RmsNormKernel(Kernel, Protocol):
    def apply(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> torch.Tensor | Int8Rows: ...


class AddRmsNormKernel(Kernel, Protocol):
    def apply(
        self, x: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, eps: float, int8: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | Int8Rows]: ...


class GatedRmsNormKernel(Kernel, Protocol):
    def apply(self, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm(x) * weight * silu(z) over the last dim: x, z [T, H, D] (a Gated DeltaNet's output
        gate); float32."""


class RopeKernel(Kernel, Protocol):
    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor: ...


class RmsNormRopeKernel(Kernel, Protocol):
    def apply(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        neox: bool,
    ) -> torch.Tensor: ...


class AttentionHeadsKernel(Kernel, Protocol):
    def apply(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_weight: torch.Tensor | None,
        k_weight: torch.Tensor | None,
        eps: float,
        cos: torch.Tensor,
        sin: torch.Tensor,
        neox: bool,
        pages: KVPages,
        index: torch.Tensor,
        slots: torch.Tensor | int,  # token t's slot slots[t], or one slot for every token
    ) -> torch.Tensor: ...


class GatedActKernel(Kernel, Protocol):
    def apply(
        self, gate: torch.Tensor, up: torch.Tensor, act: str, int8: bool = False
    ) -> torch.Tensor | Int8Rows: ...


class AttentionPrefillKernel(Kernel, Protocol):
    # a query row's result depends on its query, its position and the entries up to it alone: never on
    # the other rows of the call, nor on where the call's rows start (the chunk a prompt's token came in)
    chunk_invariant: bool = False

    def apply(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        first: int,
        scale: float,
        window: int | None,
    ) -> torch.Tensor: ...


class AttentionDecodeKernel(Kernel, Protocol):
    def apply(
        self,
        q: torch.Tensor,
        pages: KVPages,
        index: torch.Tensor,
        slots: torch.Tensor | int,  # token t reads slot slots[t] at positions 0..index[t]
        scale: float,
        window: int | None,
        int8: bool = False,
    ) -> torch.Tensor | Int8Rows: ...


def restart_state(state: torch.Tensor, restart: torch.Tensor | None) -> None:
    """The recurrent ops' `restart`: a [1] int64 device tensor, the position of the pass's first token;
    where it is 0 the sequence starts afresh, its state counting as zeros (a captured decode step at a
    position on the device, so no host sync: the kernels read no state then). This is the torch form."""
    if restart is not None:
        state.masked_fill_(restart == 0, 0.0)


class CausalConvKernel(Kernel, Protocol):
    def apply(
        self,
        x: torch.Tensor,
        state: torch.Tensor,
        weight: torch.Tensor,
        slots: torch.Tensor | None = None,  # token t advances slot slots[t] of state [slots, C, K - 1]
        restart: torch.Tensor | None = None,  # one slot's pass only (see `restart_state`)
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class DeltaGates:
    """A Gated DeltaNet's gate parameters per value head ([H] each). Given them, the delta rule takes
    the projections' logits as g and beta and forms the log decay g = decay * softplus(g + bias)
    (decay = -exp(A_log)) and beta = sigmoid(beta) itself (on the GPU in the step kernel)."""

    decay: torch.Tensor
    bias: torch.Tensor


class DeltaRuleKernel(Kernel, Protocol):
    def apply(
        self,
        q: torch.Tensor,  # [T, Hk, Dk] with Hk dividing H (v's heads): see tiled_heads
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        state: torch.Tensor,
        scale: float,
        slots: torch.Tensor | None = None,  # token t advances slot slots[t] of state [slots, H, Dk, Dv]
        qk_norm_eps: float | None = None,  # q and k L2-normalised first with this eps (None: given so)
        gates: DeltaGates | None = None,  # g and beta are logits (see DeltaGates)
        tiled_heads: bool = True,  # value head h reads key head h % Hk, else h // (H / Hk)
        restart: torch.Tensor | None = None,  # one slot's pass only (see `restart_state`)
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class ProductSpec:
    """One weight matrix's product as a layer kernel runs it."""

    kernel: LinearKernel
    route: str  # the backend the registry resolved the product to
    weight: Any  # `kernel.prepare`'s result
    out_features: int
    in_features: int
    split_sizes: tuple[int, ...]  # rows of each named matrix stacked in this one
    has_bias: bool
    has_collective: bool  # a tensor-parallel all-reduce follows the product


@dataclass(frozen=True)
class FusedProductSpec:
    """Matrices reading one input, merged into `parts`: their outputs concatenated in part order hold
    the named matrices in the order `order` undoes (named matrix i is concatenated piece order[i])."""

    parts: tuple[ProductSpec, ...]
    order: tuple[int, ...]


@dataclass(frozen=True)
class LayerSpec:
    """A pre-norm attention + gated FFN decoder layer, as data."""

    n_embd: int
    n_heads: int
    n_kv_heads: int
    key_dim: int
    value_dim: int
    eps: float
    attn_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_attn_norm: torch.Tensor | None
    ffn_norm: torch.Tensor
    post_ffn_norm: torch.Tensor | None
    qkv: FusedProductSpec  # named matrices q, k, v
    o: ProductSpec
    gate_up: FusedProductSpec  # named matrices gate, up
    down: ProductSpec
    activation: str  # a name of `gufo.kernels.pointwise.ACTIVATIONS`
    rope_dim: int
    rope_neox: bool
    window: int | None  # sliding-window length, None: global attention
    attn_scale: float


class KVCacheView(Protocol):
    """What a decode layer kernel reads of a KV cache: each layer's pages and the slots' table."""

    def pages(self, layer: int) -> KVPages: ...

    @property
    def context(self) -> int: ...


class MoeRouteKernel(Kernel, Protocol):
    def apply(
        self, logits: torch.Tensor, k: int, normalize: bool, extra: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Router logits [T, E] -> (weights [T, k] float32, expert ids [T, k] int64): the softmax over
        the E experts, its k largest probabilities in descending order (ties: the lower id first) and
        their experts; with `normalize`, the k weights divided by their sum. With `extra`, the ids are
        [T, k + 1], each row's last the id `extra` (the shared expert, run as one more assignment)."""
        ...


class MoeCombineKernel(Kernel, Protocol):
    def apply(
        self,
        y: torch.Tensor,
        weights: torch.Tensor,
        shared: torch.Tensor | None = None,
        shared_gate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per assignment results y [T * k, C] (token-major), or a [T, k, C] view -> [T, C] float32:
        each token's k rows times weights [T, k], summed in slot order; plus sigmoid(shared_gate) [T, 1]
        times shared [T, C] (the shared expert) when given."""
        ...


class DecodeLayerKernel(Kernel, Protocol):
    # a few consecutive tokens in one call get the numbers each would get alone (speculative
    # verification reads the weights once for all drafts without changing greedy output)
    batch_invariant: bool = False
    multi_slot: bool = False  # takes `RowPositions`: several sequences' decode steps in one call
    max_tokens: int | None = None  # tokens one batch-invariant call takes; None: any (it chunks)

    def prepare(self, specs: list[LayerSpec]) -> Any | None:
        """The plan of these layers, or None where the kernel cannot run one of them."""
        ...

    def apply(
        self,
        plan: Any,
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCacheView,
        slot: int,
        start_pos: int | RowPositions | TokenPositions,
    ) -> torch.Tensor: ...


LINEAR: Op[LinearKernel] = Op("linear")
EXPERT_LINEAR: Op[ExpertLinearKernel] = Op("expert_linear")
RMS_NORM: Op[RmsNormKernel] = Op("rms_norm")
ADD_RMS_NORM: Op[AddRmsNormKernel] = Op("add_rms_norm")
GATED_RMS_NORM: Op[GatedRmsNormKernel] = Op("gated_rms_norm")
ROPE: Op[RopeKernel] = Op("rope")
RMS_NORM_ROPE: Op[RmsNormRopeKernel] = Op("rms_norm_rope")
ATTENTION_HEADS: Op[AttentionHeadsKernel] = Op("attention_heads")
GATED_ACT: Op[GatedActKernel] = Op("gated_act")
ATTENTION_PREFILL: Op[AttentionPrefillKernel] = Op("attention_prefill")
ATTENTION_DECODE: Op[AttentionDecodeKernel] = Op("attention_decode")
CAUSAL_CONV1D: Op[CausalConvKernel] = Op("causal_conv1d")
GATED_DELTA_RULE: Op[DeltaRuleKernel] = Op("gated_delta_rule")
DECODE_LAYER: Op[DecodeLayerKernel] = Op("decode_layer")
MOE_ROUTE: Op[MoeRouteKernel] = Op("moe_route")
MOE_COMBINE: Op[MoeCombineKernel] = Op("moe_combine")

"""Decoder-only transformer skeleton shared by the architectures; each arch module fills in its blocks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile, TensorInfo
from gufo.kernels import backends, registry
from gufo.kernels.contracts import (
    ATTENTION_HEADS,
    DECODE_LAYER,
    GATED_ACT,
    RMS_NORM_ROPE,
    ROPE,
    LayerSpec,
)
from gufo.kernels.int8_rows import Int8Rows
from gufo.kernels.positions import RowPositions, TokenPositions
from gufo.models.kv_cache import KVCache
from gufo.models.layers import (
    ACTIVATIONS,
    AttentionKernels,
    DevicePosition,
    Embedding,
    FusedLinear,
    Linear,
    RMSNorm,
    attend_written,
    attention,
    own_kernel,
    takes_int8,
)
from gufo.models.rope import Rope


@dataclass
class ModelConfig:
    architecture: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_heads: int
    n_kv_heads: int
    key_dim: int
    value_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def from_file(cls, mf: ModelFile) -> ModelConfig:
        n_embd = int(mf.arch_key("embedding_length"))
        n_heads = int(mf.arch_key("attention.head_count"))
        head_dim = n_embd // n_heads
        vocab = mf.arch_key("vocab_size", None) or len(mf.require("tokenizer.ggml.tokens"))
        n_kv = mf.arch_key("attention.head_count_kv", n_heads)
        return cls(
            architecture=mf.architecture,
            n_layers=int(mf.arch_key("block_count")),
            n_embd=n_embd,
            n_ff=int(mf.arch_key("feed_forward_length", 0)),  # optional in llama.cpp (MoE files lack it)
            n_heads=n_heads,
            n_kv_heads=int(n_kv),
            key_dim=int(mf.arch_key("attention.key_length", head_dim)),
            value_dim=int(mf.arch_key("attention.value_length", head_dim)),
            vocab_size=int(vocab),
            context_length=int(mf.arch_key("context_length")),
            rms_eps=float(mf.arch_key("attention.layer_norm_rms_epsilon")),
        )


def mtp_block_index(mf: ModelFile) -> int:
    """The index of the file's first multi-token-prediction (NextN) block, after the trunk's layers;
    BadInputError when it has none (llama.cpp's converter leaves it out with --no-mtp)."""
    count = int(mf.arch_key("nextn_predict_layers", 0))
    index = int(mf.arch_key("block_count")) - count
    if count < 1 or f"blk.{index}.nextn.eh_proj.weight" not in mf.tensors:
        raise BadInputError(
            f"{mf.label} has no multi-token-prediction block ({mf.architecture}.nextn_predict_layers and "
            "blk.N.nextn.* tensors; llama.cpp's converter leaves it out with --no-mtp)"
        )
    return index


class SelfAttention:
    """Projections (q, k, v as three tensors or as the converter's fused attn_qkv, each with its bias
    when the file has one), optional per-head QK RMSNorm, RoPE, cached attention, output projection."""

    def __init__(
        self,
        mf: ModelFile,
        prefix: str,
        cfg: ModelConfig,
        backend: str,
        rope: Rope,
        scale: float,
        qk_norm: bool,
        window: int | None = None,
    ):
        if f"{prefix}.attn_qkv.weight" in mf.tensors:
            rows = [self.query_rows(cfg), cfg.n_kv_heads * cfg.key_dim, cfg.n_kv_heads * cfg.value_dim]
            biases = [f"{prefix}.attn_{n}.bias" for n in ("q", "k", "v")]
            self.qkv = FusedLinear.split(mf, f"{prefix}.attn_qkv.weight", rows, backend, biases)
        else:
            self.qkv = FusedLinear(mf, [f"{prefix}.attn_{n}.weight" for n in ("q", "k", "v")], backend)
        self.o = Linear(mf, f"{prefix}.attn_output.weight", backend)
        eps = cfg.rms_eps
        self.q_norm = RMSNorm(mf, f"{prefix}.attn_q_norm.weight", eps, backend) if qk_norm else None
        self.k_norm = RMSNorm(mf, f"{prefix}.attn_k_norm.weight", eps, backend) if qk_norm else None
        self.cfg, self.rope, self.scale, self.window = cfg, rope, scale, window
        self.rope_kernel = registry.lookup(backend, ROPE)[1]
        self.norm_rope_kernel = own_kernel(backend, RMS_NORM_ROPE) if qk_norm else None
        self.heads_kernel = own_kernel(backend, ATTENTION_HEADS)  # decode: heads into the cache at once
        self.kernels = AttentionKernels.of(backend)

    @staticmethod
    def query_rows(cfg: ModelConfig) -> int:
        """Rows of the query projection."""
        return cfg.n_heads * cfg.key_dim

    def takes_int8(self, rows: int) -> bool:
        return self.qkv.takes_int8(rows)

    def __call__(
        self,
        x: torch.Tensor | Int8Rows,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
        slot: int,
        start_pos: int | DevicePosition,
    ) -> torch.Tensor:
        q, k, v = self.qkv(x)
        int8 = takes_int8(self.o, q)
        return self.o(self.attend(q, k, v, rope_tables, cache, layer, slot, start_pos, int8))

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
        slot: int,
        start_pos: int | DevicePosition,
        int8: bool = False,
    ) -> torch.Tensor | Int8Rows:
        """Projected q, k, v -> heads, QK norm, RoPE, cached attention: [T, n_heads * value_dim].
        `int8`: the output projection takes `Int8Rows`, which a graph-captured decode step hands it."""
        if isinstance(start_pos, DevicePosition) and self.heads_kernel is not None:
            pages, slots = cache.pages(layer), slot if start_pos.slots is None else start_pos.slots
            q = self.heads_kernel.apply(*self._shaped(q, k, v), *self._qk_norms(), *rope_tables,
                                        self.rope.neox, pages, start_pos.index, slots)  # fmt: skip
            decode = self.kernels.decode
            return attend_written(q, pages, slot, start_pos, self.scale, self.window, decode, int8)
        q, k, v = self.heads(q, k, v, rope_tables)
        return attention(q, k, v, cache, layer, slot, start_pos, self.scale, self.window, self.kernels)

    def heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projected q, k, v -> [T, heads, dim] each, q and k normed (QK norm) and rotated (RoPE)."""
        q, k, v = self._shaped(q, k, v)
        if self.norm_rope_kernel is not None:  # QK norm and RoPE in one pass per tensor
            fused, neox = self.norm_rope_kernel, self.rope.neox
            q = fused.apply(q, self.q_norm.weight, self.q_norm.eps, *rope_tables, neox)
            k = fused.apply(k, self.k_norm.weight, self.k_norm.eps, *rope_tables, neox)
        else:
            if self.q_norm is not None:
                q = self.q_norm(q)
                k = self.k_norm(k)
            q = self.rope_kernel.apply(q, *rope_tables, self.rope.neox)
            k = self.rope_kernel.apply(k, *rope_tables, self.rope.neox)
        return q, k, v

    def _shaped(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg, n = self.cfg, q.shape[0]
        return (
            q.reshape(n, cfg.n_heads, cfg.key_dim),
            k.reshape(n, cfg.n_kv_heads, cfg.key_dim),
            v.reshape(n, cfg.n_kv_heads, cfg.value_dim),
        )

    def _qk_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        if self.q_norm is None:
            return None, None, 0.0
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps


class GatedFFN:
    """down(act(gate(x)) * up(x)): SwiGLU with "silu", GeGLU with "gelu_tanh" (names in ACTIVATIONS)."""

    def __init__(self, mf: ModelFile, prefix: str, backend: str, act: str, suffix: str = ""):
        gate, up, down = (f"{prefix}.ffn_{n}{suffix}.weight" for n in ("gate", "up", "down"))
        self.gate_up = FusedLinear(mf, [gate, up], backend)
        self.down = Linear(mf, down, backend)
        self._activation(backend, act)

    @classmethod
    def of(cls, gate_up: FusedLinear, down: TensorInfo, backend: str, act: str) -> GatedFFN:
        """From tensors the file does not name on their own (one expert's slices of 3-D tensors)."""
        ffn = cls.__new__(cls)
        ffn.gate_up = gate_up
        ffn.down = Linear.of([down], backend)
        ffn._activation(backend, act)
        return ffn

    def _activation(self, backend: str, act: str) -> None:
        if act not in ACTIVATIONS:
            raise ValueError(f"unknown activation {act!r}")
        self.act_name = act
        self.activation = registry.lookup(backend, GATED_ACT)[1]

    def takes_int8(self, rows: int) -> bool:
        return self.gate_up.takes_int8(rows)

    def __call__(self, x: torch.Tensor | Int8Rows) -> torch.Tensor:
        gate, up = self.gate_up(x)
        if takes_int8(self.down, gate):
            return self.down(self.activation.apply(gate, up, self.act_name, int8=True))
        return self.down(self.activation.apply(gate, up, self.act_name))


class DecoderLayer:
    """Pre-norm attention and gated FFN, each added to the residual; gemma3 also norms both outputs.

    This torch path runs prefill and is the reference for the backends' fused "decode_layer" op.
    `attn` may be any token mixer with SelfAttention's call signature (hybrid models); `ffn_norm` names
    the pre-FFN norm tensor (qwen35 calls it post_attention_norm); `ffn`, when given, replaces the dense
    gated FFN (any callable on [T, n_embd], e.g. a mixture of experts).
    """

    def __init__(
        self,
        mf: ModelFile,
        index: int,
        cfg: ModelConfig,
        backend: str,
        attn: SelfAttention,
        act: str,
        post_norms: bool,
        ffn_norm: str = "ffn_norm",
        ffn: Any = None,
    ):
        prefix, eps = f"blk.{index}", cfg.rms_eps
        self.attn_norm = RMSNorm(mf, f"{prefix}.attn_norm.weight", eps, backend)
        self.ffn_norm = RMSNorm(mf, f"{prefix}.{ffn_norm}.weight", eps, backend)
        self.post_attn_norm = (
            RMSNorm(mf, f"{prefix}.post_attention_norm.weight", eps, backend) if post_norms else None
        )
        self.post_ffn_norm = (
            RMSNorm(mf, f"{prefix}.post_ffw_norm.weight", eps, backend) if post_norms else None
        )
        self.attn = attn
        self.ffn = GatedFFN(mf, prefix, backend, act) if ffn is None else ffn

    def __call__(
        self,
        x: torch.Tensor | Residual,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        index: int,
        slot: int,
        start_pos: int | DevicePosition,
        defer: bool = False,
    ) -> torch.Tensor | Residual:
        """The residual stream after this layer: its three phases. x may be a `Residual` (the previous
        layer's deferred add, done here with this layer's pre-norm); `defer` returns this layer's add
        deferred too."""
        x, normed = self.pre_attention(x)
        h = self.attn(normed, rope_tables, cache, index, slot, start_pos)
        return self.post_attention(x, h, defer)

    def spec(self) -> LayerSpec | None:
        """This layer as data for a fused decode-layer kernel; None unless it is plain attention and a
        dense gated FFN (hybrid token mixers and expert FFNs run as the torch layer)."""
        attn, ffn = self.attn, self.ffn
        if type(attn) is not SelfAttention or not isinstance(ffn, GatedFFN):
            return None
        cfg = attn.cfg

        def weight(norm: RMSNorm | None) -> torch.Tensor | None:
            return None if norm is None else norm.weight

        return LayerSpec(
            cfg.n_embd,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.key_dim,
            cfg.value_dim,
            cfg.rms_eps,
            self.attn_norm.weight,
            weight(attn.q_norm),
            weight(attn.k_norm),
            weight(self.post_attn_norm),
            self.ffn_norm.weight,
            weight(self.post_ffn_norm),
            attn.qkv.spec(),
            attn.o.spec(),
            ffn.gate_up.spec(),
            ffn.down.spec(),
            ffn.act_name,
            attn.rope.dim,
            attn.rope.neox,
            attn.window,
            attn.scale,
        )

    def pre_attention(self, x: torch.Tensor | Residual) -> tuple[torch.Tensor, torch.Tensor | Int8Rows]:
        """(the residual stream, its pre-attention norm): the token mixer reads the second."""
        if isinstance(x, Residual):
            return self.attn_norm.after_add(x.stream, x.pending, takes_int8(self.attn, x.stream))
        return x, self.attn_norm(x, takes_int8(self.attn, x))

    def post_attention(
        self, x: torch.Tensor, h: torch.Tensor, defer: bool = False
    ) -> torch.Tensor | Residual:
        """The residual stream x after adding the token mixer's output h, then the FFN's (that last add
        left pending in a `Residual` with `defer`)."""
        h = h if self.post_attn_norm is None else self.post_attn_norm(h)
        x, normed = self.ffn_norm.after_add(x, h, takes_int8(self.ffn, x))
        h = self.ffn(normed)
        h = h if self.post_ffn_norm is None else self.post_ffn_norm(h)
        return Residual(x, h) if defer else x + h


ROPE_BLOCK = 256  # positions per block of a rope table (`DecoderModel.host_rope_table`)

# Most tokens one batch-invariant per-token pass takes on GPUs: the skinny products' row limit, up to
# which each row gets its M = 1 arithmetic (gufo.kernels.triton's MAX_BLOCK_M).
PER_TOKEN_MAX_TOKENS = 16
# The same where every product runs on the tensor-core rows (KernelOptions.row_products "tensor" or "f16"),
# whose rows keep their M = 1 numbers up to launch.MAX_TENSOR_ROWS / MAX_HALF_ROWS rows (docs/decisions.md)
WIDE_MAX_TOKENS = 64
WIDE_ROUTE = "cuda:torch-layer-per-token-64-rows"


@dataclass(frozen=True)
class DecodeRoute:
    """How a model runs one-token steps, with what that way can do (the engine reads these fields)."""

    name: str  # "backend:kernel", for reports
    step: Callable[..., torch.Tensor | Residual]  # (index, x, rope_tables, cache, slot, start_pos)
    batch_invariant: bool  # several consecutive tokens in one pass give each its one-token numbers
    max_tokens: int | None  # most tokens such a pass takes (None: any number)
    multi_slot: bool  # takes RowPositions: decode steps of several sequences in one pass


@dataclass(frozen=True)
class Residual:
    """The residual stream with an addend still to add: a decode layer leaves its last add to the next
    layer's pre-norm, which does both in one launch (`RMSNorm.after_add`)."""

    stream: torch.Tensor
    pending: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.stream.shape


class DecoderModel:
    """Embedding -> blocks -> final norm -> output projection. Subclasses build `blocks` and `ropes`."""

    embedding_scale: float = 1.0
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap) (final_logit_softcapping)
    graph_capturable = True  # a decode step may be captured in a CUDA graph (no host reads of values)

    def __init__(self, mf: ModelFile, cfg: ModelConfig, backend: str):
        self.config = cfg
        self.backend = backend
        self.device = backends.device_of(backend)
        self.embedding = Embedding(mf, "token_embd.weight", backend)
        self.output_norm = RMSNorm(mf, "output_norm.weight", cfg.rms_eps, backend)
        output_name = "output.weight" if "output.weight" in mf.tensors else "token_embd.weight"
        self.output = Linear(mf, output_name, backend)
        self.ropes: list[Rope] = []
        self.layers: list[DecoderLayer] = []
        self._position_tables: dict[tuple[Rope, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._host_rope: dict[Rope, tuple[torch.Tensor, torch.Tensor]] = {}
        # layer index -> a function of its output stream on multi-token (prefill) passes: a debug
        # perturbation (gufo.tools.quality.validate_prefill); eager only (see Engine.add_prefill_tap)
        self.prefill_taps: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {}

    def known_unused(self, tensor_name: str) -> bool:
        """Whether a file tensor this model does not load is known not to change its logits."""
        return False

    def new_cache(self, n_slots: int, context: int, **layout: Any) -> KVCache:
        """The cache this model runs on, on its device: KV entries for every layer, or as `layout`
        (KVCache's attention_layers / recurrent) says for hybrid models."""
        cfg = self.config
        return KVCache(
            cfg.n_layers,
            n_slots,
            cfg.n_kv_heads,
            context,
            cfg.key_dim,
            cfg.value_dim,
            dtype=backends.cache_dtype(self.backend),
            device=self.device,
            **layout,
        )

    @functools.cached_property
    def decode_route(self) -> DecodeRoute:
        """How this model runs one-token steps: the backend's fused "decode_layer" kernel where it takes
        every layer, else the model's own layers (per token and batch-invariant on GPUs)."""
        found = registry.find(self.backend, DECODE_LAYER)
        specs = [layer.spec() for layer in self.layers]
        if found is not None and found[0] == self.backend and None not in specs:
            route, kernel = found
            plan = kernel.prepare(specs)
            if plan is not None:
                step = functools.partial(kernel.apply, plan)
                name = f"{route}:{kernel.name}"
                return DecodeRoute(name, step, kernel.batch_invariant, kernel.max_tokens, kernel.multi_slot)
        if self.backend == "cuda" and self.wide_rows():
            return DecodeRoute(WIDE_ROUTE, self._layer_per_token, True, WIDE_MAX_TOKENS, False)
        if self.backend == "cuda":
            return DecodeRoute(
                "cuda:torch-layer-per-token", self._layer_per_token, True, PER_TOKEN_MAX_TOKENS, False
            )
        return self.torch_layers_route()

    def wide_rows(self) -> bool:
        """Whether a per-token pass of WIDE_MAX_TOKENS rows gives each row its one-row numbers: every
        layer plain attention and a dense FFN (whose products `_linears` sees: no experts, no recurrent
        mixer), and every product keeping that many rows' numbers, which only the tensor-core rows do
        (int8 or float16: `launch.skinny`; any other weight's 17+ rows take the prefill route, not
        batch-invariant)."""
        plain = all(
            isinstance(layer.attn, SelfAttention) and isinstance(layer.ffn, GatedFFN) for layer in self.layers
        )
        return plain and all(linear.keeps_rows(WIDE_MAX_TOKENS) for linear in self._linears())

    def packs_rows(self) -> bool:
        """Whether every product's prefill rows keep their numbers at any row count (`Linear.packs_rows`),
        so that several sequences' chunks may share a prefill pass."""
        return all(linear.packs_rows() for linear in self._linears())

    def chunk_invariant_attention(self) -> bool:
        """Whether every layer's prefill attention gives a row its numbers whatever chunk it comes in
        (`AttentionPrefillKernel.chunk_invariant`): plain attention everywhere, on such a kernel."""
        return all(
            isinstance(layer.attn, SelfAttention) and layer.attn.kernels.prefill.chunk_invariant
            for layer in self.layers
        )

    def torch_layers_route(self) -> DecodeRoute:
        """Decode on the model's own torch layers, one token per pass (not batch-invariant)."""
        return DecodeRoute("torch:torch-layer", self._layer_step, False, 1, False)

    def _layer_step(
        self,
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
    ) -> torch.Tensor:
        return self.layers[index](x, rope_tables, cache, index, slot, start_pos)

    def _layer_per_token(
        self,
        index: int,
        x: torch.Tensor | Residual,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
    ) -> torch.Tensor | Residual:
        """The layer with each of several tokens attending as its own one-token step would
        (TokenPositions); each layer's last residual add goes into the next layer's pre-norm kernel (one
        launch fewer), the last layer adds its own."""
        if isinstance(start_pos, int) and x.shape[0] > 1:
            start_pos = TokenPositions(start_pos)
        defer = index + 1 < len(self.layers)
        return self.layers[index](x, rope_tables, cache, index, slot, start_pos, defer)

    def block(
        self,
        index: int,
        x: torch.Tensor,
        tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]],
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
        per_token: bool = False,
    ) -> torch.Tensor:
        rope_tables = tables[self.layers[index].attn.rope]
        if x.shape[0] == 1 or per_token:
            return self.decode_route.step(index, x, rope_tables, cache, slot, start_pos)
        return self.layers[index](x, rope_tables, cache, index, slot, start_pos)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
        all_logits: bool = False,
        per_token: bool = False,
    ) -> torch.Tensor:
        """Run tokens (1-D) at positions start_pos.. of `slot`; logits [T, vocab] or [1, vocab] (last).

        A DevicePosition keeps every position-dependent step on the device, so the call
        can be captured in a CUDA graph. `per_token` runs several tokens through the decode-layer
        kernel instead of the prefill layers (speculative verification; see `Engine.decode_tokens`)."""
        return self.head(self.final_hidden(tokens, cache, slot, start_pos, per_token), all_logits)

    def final_hidden(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
        per_token: bool = False,
    ) -> torch.Tensor:
        """The residual stream after the last layer [T, n_embd] (before the output norm), writing the
        tokens' KV into `slot` of `cache` as `forward` does. Host positions get their pages here; a
        pass at device positions writes those its caller reserved (`KVCache.reserve`)."""
        if isinstance(start_pos, RowPositions):
            cache.reserve_rows(start_pos.slots, start_pos.positions)
        elif not isinstance(start_pos, DevicePosition):
            cache.reserve(slot, start_pos, start_pos + tokens.shape[0])
        x = self.embed(tokens)
        tables = {rope: self.rope_tables(rope, start_pos, tokens.shape[0], cache) for rope in self.ropes}
        prefill = tokens.shape[0] > 1 and not per_token
        for index in range(self.config.n_layers):
            x = self.block(index, x, tables, cache, slot, start_pos, per_token=per_token)
            if prefill and index in self.prefill_taps:
                x = self.prefill_taps[index](x)
        return x

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids (1-D) -> the residual stream's first values [T, n_embd]."""
        x = self.embedding(tokens)
        return x * self.embedding_scale if self.embedding_scale != 1.0 else x

    def head(self, x: torch.Tensor, all_logits: bool) -> torch.Tensor:
        """The last layer's output [T, n_embd] -> logits [T, vocab], or [1, vocab] of the last token."""
        logits = self.output(self.output_norm(x if all_logits else x[-1:]))
        if self.logit_softcap is None:
            return logits
        return torch.tanh(logits / self.logit_softcap) * self.logit_softcap

    def rope_tables(
        self, rope: Rope, start_pos: int | DevicePosition, n_tokens: int, cache: KVCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [T, dim] of the tokens' positions, rows of one table per rope (`host_rope_table`)."""
        if isinstance(start_pos, DevicePosition):
            key = (rope, cache.context)
            if key not in self._position_tables:  # every position of the cache, on the device once
                self._position_tables[key] = tuple(
                    t[: cache.context].to(self.device) for t in self.host_rope_table(rope, cache.context)
                )
            cos, sin = self._position_tables[key]
            return cos[start_pos.index], sin[start_pos.index]
        if isinstance(start_pos, RowPositions):
            cos, sin = self.host_rope_table(rope, max(start_pos.positions) + 1)
            index = torch.tensor(start_pos.positions)
            return cos[index].to(self.device), sin[index].to(self.device)
        cos, sin = self.host_rope_table(rope, start_pos + n_tokens)
        rows = slice(start_pos, start_pos + n_tokens)
        return cos[rows].to(self.device), sin[rows].to(self.device)

    def host_rope_table(self, rope: Rope, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`rope.tables` of positions 0..end - 1 at least, on the host, grown in blocks of ROPE_BLOCK
        positions each computed on its own: a position's values never depend on which positions were
        computed with it (torch's vectorized cos/sin and their scalar tails may round differently)."""
        cos, sin = self._host_rope.get(rope, (torch.empty(0, rope.dim), torch.empty(0, rope.dim)))
        if cos.shape[0] < end:
            starts = range(cos.shape[0], end, ROPE_BLOCK)
            blocks = [rope.tables(torch.arange(first, first + ROPE_BLOCK)) for first in starts]
            cos = torch.cat([cos, *(c for c, _ in blocks)])
            sin = torch.cat([sin, *(s for _, s in blocks)])
            self._host_rope[rope] = cos, sin
        return cos, sin

    def routes(self) -> dict[str, str]:
        """Which kernel ran each op (per linear block format), as `backend:kernel`, for reports."""
        found: dict[str, str] = {"rms_norm": f"{self.output_norm.route}:{self.output_norm.kernel.name}"}
        found["decode_layer"] = self.decode_route.name
        attention = next((layer.attn for layer in self.layers if isinstance(layer.attn, SelfAttention)), None)
        if attention is not None:  # the prompts' attention (`--prefill-products` picks it on a GPU)
            kernels = attention.kernels
            found["attention_prefill"] = f"{kernels.prefill_route}:{kernels.prefill.name}"
        for obj in self._linears():
            found.setdefault(f"linear.{obj.qtype.name}", f"{obj.route}:{obj.kernel.name}")
        return found

    def _linears(self) -> list[Linear]:
        seen: list[Linear] = [self.output]
        stack: list[object] = list(self.layers)
        while stack:
            obj = stack.pop()
            for value in vars(obj).values():
                if isinstance(value, Linear):
                    seen.append(value)
                elif isinstance(value, FusedLinear):
                    seen.extend(value.parts)
                elif isinstance(value, SelfAttention | GatedFFN):
                    stack.append(value)
        return seen

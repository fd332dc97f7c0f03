"""`qwen35` architecture (dense Qwen3.5): a hybrid of Gated DeltaNet and gated full attention.

Layer i is Gated DeltaNet linear attention where `attention.recurrent_layers` (one boolean per layer,
llama.cpp reads it first) says so; without that key, layer i is full attention when
(i + 1) % full_attention_interval == 0, else Gated DeltaNet linear
attention. Both are followed by the SwiGLU FFN, pre-norm, residual (the pre-FFN norm is named
post_attention_norm). Layout and weight transforms are those of llama.cpp's converter:

- RMSNorm weights already hold Qwen's 1 + w (all but the gated norm `ssm_norm`, which is used as is).
- Full attention: `attn_q` rows are [query, gate] per head; out = o(attention * sigmoid(gate)); per-head
  QK RMSNorm; NeoX RoPE over the first `rope.dimension_count` dims. The file's M-RoPE sections rotate
  every section by the same text position, which is plain RoPE.
- DeltaNet: `attn_qkv` (q, k, v), `attn_gate` (z), `ssm_beta`, `ssm_alpha` read the normed input; q, k,
  v pass the causal conv `ssm_conv1d` ([channels, kernel]) and SiLU; q and k are L2-normed; decay
  g = ssm_a * softplus(alpha + ssm_dt.bias) with ssm_a = -exp(A_log); beta = sigmoid(beta). The output
  is RMSNorm(o) * silu(z) per value head, then `ssm_out`. Value heads are stored tiled over the key heads
  (value head h reads key head h % key_heads).
- The `nextn_predict_layers` multi-token-prediction block after the trunk (`MultiTokenPrediction`) is
  not part of the trunk: it is built on demand, for `--speculative mtp`, as llama.cpp's graph_mtp runs it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.kernels import backends, registry
from gufo.kernels.contracts import CAUSAL_CONV1D, GATED_DELTA_RULE, DeltaGates
from gufo.kernels.positions import TokenPositions
from gufo.models.base import (
    PER_TOKEN_MAX_TOKENS,
    DecoderLayer,
    DecoderModel,
    DecodeRoute,
    GatedFFN,
    ModelConfig,
    SelfAttention,
    mtp_block_index,
)
from gufo.models.kv_cache import KVCache
from gufo.models.layers import (
    DevicePosition,
    Embedding,
    FusedLinear,
    Linear,
    RMSNorm,
    attention_scale,
    vector,
)
from gufo.models.recurrent_state import RecurrentShape, RecurrentState
from gufo.models.registry import register_architecture
from gufo.models.rope import Rope, rope_from_file

DEFAULT_FULL_ATTENTION_INTERVAL = 4  # llama.cpp's default when the key is absent


@dataclass(frozen=True)
class DeltaNetShape:
    conv_kernel: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    @classmethod
    def from_file(cls, mf: ModelFile) -> DeltaNetShape:
        key_heads = int(mf.arch_key("ssm.group_count"))
        value_heads = int(mf.arch_key("ssm.time_step_rank"))
        inner = int(mf.arch_key("ssm.inner_size"))
        if key_heads <= 0 or value_heads % key_heads or inner % value_heads:
            raise BadInputError(
                f"{mf.label}: ssm.time_step_rank {value_heads} must be a multiple of ssm.group_count "
                f"{key_heads}, and ssm.inner_size {inner} a multiple of ssm.time_step_rank"
            )
        conv = int(mf.arch_key("ssm.conv_kernel"))
        return cls(conv, key_heads, value_heads, int(mf.arch_key("ssm.state_size")), inner // value_heads)

    @property
    def channels(self) -> int:
        """Conv channels: q, k and v."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim


def _check_shape(mf: ModelFile, name: str, expected: tuple[int, ...]) -> None:
    actual = mf.tensor(name).shape
    if tuple(actual) != expected:
        raise BadInputError(f"{mf.label}: tensor {name} has shape {list(actual)}, expected {list(expected)}")


class GatedDeltaNet:
    """Linear attention with a recurrent state per slot (conv window + delta-rule matrices)."""

    rope: Rope | None = None  # positions enter only through the order of the recurrence
    tiled_value_heads = True  # value head h reads key head h % key_heads (else h // heads per key)

    def __init__(self, mf: ModelFile, prefix: str, shape: DeltaNetShape, eps: float, backend: str):
        s, device = shape, backends.device_of(backend)
        projections = self.projections(shape)
        names = [f"{prefix}.{n}.weight" for n in projections]
        for name, rows in zip(names, projections.values(), strict=True):
            _check_shape(mf, name, (rows, mf.tensor(name).shape[-1]))
        _check_shape(mf, f"{prefix}.ssm_conv1d.weight", (s.channels, s.conv_kernel))
        for name in (f"{prefix}.ssm_dt.bias", f"{prefix}.ssm_a"):
            _check_shape(mf, name, (s.value_heads,))
        self.shape, self.eps = shape, eps
        self.in_proj = FusedLinear(mf, names, backend)
        self.conv_weight = vector(mf, f"{prefix}.ssm_conv1d.weight").reshape(s.channels, -1).to(device)
        # decay -exp(A_log), stored so by the converter; the delta rule forms g and beta from them
        self.gates = DeltaGates(
            vector(mf, f"{prefix}.ssm_a").to(device), vector(mf, f"{prefix}.ssm_dt.bias").to(device)
        )
        self.norm = RMSNorm(mf, f"{prefix}.ssm_norm.weight", eps, backend)
        self.out = Linear(mf, f"{prefix}.ssm_out.weight", backend)
        _, self.conv = registry.lookup(backend, CAUSAL_CONV1D)
        _, self.delta_rule = registry.lookup(backend, GATED_DELTA_RULE)

    @staticmethod
    def projections(s: DeltaNetShape) -> dict[str, int]:
        """The input projections (tensor name -> output rows), all reading the normed input."""
        h = s.value_heads
        return {"attn_qkv": s.channels, "attn_gate": h * s.value_dim, "ssm_beta": h, "ssm_alpha": h}

    def project(self, x: torch.Tensor) -> list[torch.Tensor]:
        """qkv, z, beta logits, alpha: [T, channels], [T, value_heads * value_dim], [T, value_heads] x 2."""
        return self.in_proj(x)

    def takes_int8(self, rows: int) -> bool:
        """The projections read float rows (their int8 handoff is not wired for this mixer)."""
        return False

    def linears(self) -> list[Linear]:
        return [*self.in_proj.parts, self.out]

    def __call__(
        self,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache,
        layer: int,
        slot: int,
        start_pos: int | DevicePosition | TokenPositions,
    ) -> torch.Tensor:
        """With `TokenPositions`, or where the state's `keep_steps` asks for the state after each token
        (a captured verification step), each token after the (batched) input projections runs the mixer
        as its own one-token step would, conv and delta-rule state advanced token by token (and kept
        after each where asked). With a `DevicePosition` of several slots each token is the next of its
        own slot's sequence, all in one pass of the kernels. A one-slot pass at a `DevicePosition` starts
        the state afresh where its first position is 0, in the kernels (`contracts.restart_state`)."""
        state = cache.recurrent
        rows = start_pos.slots if isinstance(start_pos, DevicePosition) else None
        restart = start_pos.index[:1] if isinstance(start_pos, DevicePosition) and rows is None else None
        if rows is None:
            conv, delta = state.conv[layer][slot], state.delta[layer][slot]
        else:
            conv, delta = state.conv[layer], state.delta[layer]
        projected = self.project(x)
        if isinstance(start_pos, TokenPositions) or (rows is None and state.keeping(slot)):
            steps = []
            for t in range(x.shape[0]):
                first = restart if t == 0 else None
                steps.append(self.mix(*(p[t : t + 1] for p in projected), conv, delta, None, first))
                state.stepped(layer, slot, t)
            out = torch.cat(steps)
        else:
            out = self.mix(*projected, conv, delta, rows, restart)
        return self.out(out)

    def mix(
        self,
        qkv: torch.Tensor,
        z: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        conv: torch.Tensor,
        delta: torch.Tensor,
        slots: torch.Tensor | None = None,
        restart: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Projected rows -> the output projection's input [T, value_heads * value_dim], advancing the
        slot's conv window and delta-rule state; with `slots` ([T] int64) conv and delta are the layer's
        state of every slot and row t advances slot slots[t]'s. `restart`: `contracts.restart_state`."""
        s, n = self.shape, qkv.shape[0]
        mixed = F.silu(self.conv.apply(qkv, conv, self.conv_weight, slots, restart))
        q, k, v = mixed.split(
            [s.key_heads * s.key_dim, s.key_heads * s.key_dim, s.value_heads * s.value_dim], -1
        )
        q, k = q.reshape(n, s.key_heads, s.key_dim), k.reshape(n, s.key_heads, s.key_dim)
        v = v.reshape(n, s.value_heads, s.value_dim)
        out = self.delta_rule.apply(
            q,
            k,
            v,
            a,
            b,
            delta,
            s.key_dim**-0.5,
            slots,
            self.eps,
            self.gates,
            self.tiled_value_heads,
            restart,
        )
        out = self.norm.gated(out, z.reshape(n, s.value_heads, s.value_dim))
        return out.reshape(n, -1)


class GatedAttention(SelfAttention):
    """Full attention whose query projection also yields a per-head output gate (sigmoid)."""

    def __init__(self, mf: ModelFile, prefix: str, cfg: ModelConfig, backend: str, rope: Rope):
        if f"{prefix}.attn_qkv.weight" not in mf.tensors:
            _check_shape(mf, f"{prefix}.attn_q.weight", (self.query_rows(cfg), cfg.n_embd))
        super().__init__(mf, prefix, cfg, backend, rope, attention_scale(mf, cfg.key_dim), qk_norm=True)

    @staticmethod
    def query_rows(cfg: ModelConfig) -> int:
        """Rows of the query projection: each head's query, then its gate."""
        return 2 * cfg.n_heads * cfg.key_dim

    def __call__(
        self,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache,
        layer: int,
        slot: int,
        start_pos: int | DevicePosition,
    ) -> torch.Tensor:
        n = x.shape[0]
        q_gate, k, v = self.qkv(x)
        q, gate = q_gate.reshape(n, self.cfg.n_heads, 2, self.cfg.key_dim).unbind(2)
        out = self.attend(q, k, v, rope_tables, cache, layer, slot, start_pos)
        return self.o(out * torch.sigmoid(gate).reshape(n, -1))  # sigmoid first: no copy of the strided gate


class MultiTokenPrediction:
    """The multi-token-prediction (NextN) block `blk.<index>` after the trunk, as llama.cpp's qwen35
    graph_mtp runs it (qwen35moe's and qwen3next's are the same but for the block's FFN).

    The entry at position p reads the token at p and the hidden state h of position p - 1 (output-normed:
    the trunk's for a context token, this block's own for a drafted one): x = eh_proj([enorm(embed(token)),
    hnorm(h)]), then one gated-attention decoder block over the block's own KV cache (RoPE at p), then
    `nextn.shared_head_norm` (else the output norm). That is the hidden state of position p; its logits
    (`nextn.shared_head_head`, else the output matrix) predict the token at p + 1. `nextn.embed_tokens`,
    when present, replaces the token embedding."""

    def __init__(self, model: Qwen35Model, mf: ModelFile, index: int, backend: str):
        cfg, prefix = model.config, f"blk.{index}.nextn"
        self.model, self.index = model, index
        self.enorm = RMSNorm(mf, f"{prefix}.enorm.weight", cfg.rms_eps, backend)
        self.hnorm = RMSNorm(mf, f"{prefix}.hnorm.weight", cfg.rms_eps, backend)
        _check_shape(mf, f"{prefix}.eh_proj.weight", (cfg.n_embd, 2 * cfg.n_embd))
        self.eh_proj = Linear(mf, f"{prefix}.eh_proj.weight", backend)
        attention = GatedAttention(mf, f"blk.{index}", cfg, backend, model.rope)
        ffn = model.feed_forward(mf, f"blk.{index}", backend)
        self.layer = DecoderLayer(
            mf, index, cfg, backend, attention, "silu", False, "post_attention_norm", ffn
        )
        embed, head, norm = (
            f"{prefix}.{n}.weight" for n in ("embed_tokens", "shared_head_head", "shared_head_norm")
        )
        self.embedding = Embedding(mf, embed, backend) if embed in mf.tensors else model.embedding
        self.head_norm = RMSNorm(mf, norm, cfg.rms_eps, backend) if norm in mf.tensors else model.output_norm
        self.head = Linear(mf, head, backend) if head in mf.tensors else model.output

    def new_cache(self, n_slots: int, context: int) -> KVCache:
        """KV entries of this block's attention only (the trunk's layers get none)."""
        cfg, model = self.model.config, self.model
        dtype = backends.cache_dtype(model.backend)
        return KVCache(
            self.index + 1,
            n_slots,
            cfg.n_kv_heads,
            context,
            cfg.key_dim,
            cfg.value_dim,
            dtype=dtype,
            device=model.device,
            attention_layers=[self.index],
        )

    def trunk_hidden(self, final_hidden: torch.Tensor) -> torch.Tensor:
        """The trunk's last-layer output rows -> this block's hidden input (the trunk's output norm)."""
        return self.model.output_norm(final_hidden)

    def __call__(
        self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache, slot: int, start: int
    ) -> torch.Tensor:
        """The hidden states [T, n_embd] of tokens (1-D) at positions start.., each read with the row of
        `hidden` before it (output-normed), writing their entries into `slot` of `cache`."""
        x = torch.cat([self.enorm(self.embedding(tokens)), self.hnorm(hidden.to(self.model.device))], -1)
        x = self.eh_proj(x)
        cache.reserve(slot, start, start + tokens.shape[0])
        tables = self.model.rope_tables(self.model.rope, start, tokens.shape[0], cache)
        return self.head_norm(self.layer(x, tables, cache, self.index, slot, start))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden states [T, n_embd] -> logits [T, vocab] of the token after each."""
        return self.head(hidden)


def recurrent_layers(mf: ModelFile, n_layers: int) -> tuple[int, ...]:
    """The trunk's DeltaNet layers (llama.cpp's order: the per-layer list, then the interval)."""
    interval = int(mf.arch_key("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL))
    flags = mf.arch_key("attention.recurrent_layers", None)
    if flags is not None:
        if not isinstance(flags, list) or len(flags) < n_layers:
            raise BadInputError(
                f"{mf.label}: attention.recurrent_layers must list each of the {n_layers} layers"
            )
        return tuple(i for i in range(n_layers) if flags[i])
    if interval <= 0:
        raise BadInputError(f"{mf.label}: full_attention_interval must be positive, got {interval}")
    return tuple(i for i in range(n_layers) if (i + 1) % interval)


@register_architecture("qwen35")
class Qwen35Model(DecoderModel):
    delta_net: type[GatedDeltaNet] = GatedDeltaNet  # the linear-attention mixer (its file layout)

    def __init__(self, mf: ModelFile, backend: str):
        cfg = ModelConfig.from_file(mf)
        cfg.n_layers -= int(mf.arch_key("nextn_predict_layers", 0))
        super().__init__(mf, cfg, backend)
        self.delta_shape = DeltaNetShape.from_file(mf)
        self.recurrent_layers = recurrent_layers(mf, cfg.n_layers)
        rope_dim = int(mf.arch_key("rope.dimension_count", cfg.key_dim))
        mf.arch_key("rope.dimension_sections", None)  # one text position rotates every section alike
        self.rope = rope_from_file(mf, rope_dim, True, 10_000_000.0)
        self.ropes = [self.rope]
        for i in range(cfg.n_layers):
            prefix = f"blk.{i}"
            if i in self.recurrent_layers:
                mixer: Any = self.delta_net(mf, prefix, self.delta_shape, cfg.rms_eps, backend)
            else:
                mixer = GatedAttention(mf, prefix, cfg, backend, self.rope)
            ffn = self.feed_forward(mf, prefix, backend)
            layer = DecoderLayer(mf, i, cfg, backend, mixer, "silu", False, "post_attention_norm", ffn)
            self.layers.append(layer)

    def known_unused(self, tensor_name: str) -> bool:
        """The multi-token-prediction blocks after the trunk (`multi_token_prediction` loads them)."""
        parts = tensor_name.split(".")
        return parts[0] == "blk" and int(parts[1]) >= self.config.n_layers

    def multi_token_prediction(self, mf: ModelFile, backend: str) -> MultiTokenPrediction:
        """The first multi-token-prediction block of `mf` (this model's file), loaded now; BadInputError
        when the file has none."""
        return MultiTokenPrediction(self, mf, mtp_block_index(mf), backend)

    def feed_forward(self, mf: ModelFile, prefix: str, backend: str) -> Any:
        """The block's FFN; None is DecoderLayer's dense SwiGLU."""
        return None

    def new_cache(self, n_slots: int, context: int, **layout: Any) -> KVCache:
        """KV entries for the attention layers only, recurrent state for the others (`layout` as the
        base model's takes it)."""
        cfg, s = self.config, self.delta_shape
        shape = RecurrentShape(
            self.recurrent_layers,
            (s.channels, s.conv_kernel - 1),
            (s.value_heads, s.key_dim, s.value_dim),
        )
        attention_layers = [i for i in range(cfg.n_layers) if i not in self.recurrent_layers]
        return super().new_cache(
            n_slots,
            context,
            attention_layers=attention_layers,
            # float32 whatever the KV type: the state accumulates over the whole sequence
            recurrent=RecurrentState(shape, n_slots, device=self.device),
            **layout,
        )

    @functools.cached_property
    def decode_route(self) -> DecodeRoute:
        """The torch layers (the fused decode kernels take attention layers only). On the CPU, when every
        product is batch-invariant (the int8 kernel) and the FFNs are dense, they take any number of
        tokens, each computed as its own one-token step would be: attention per token over the cache,
        the DeltaNet mixer token by token between batched products. Prefill then runs them too and
        equals decode bit for bit (docs/decisions.md, "CPU prefill of the hybrid runs token by token").
        On GPUs with dense FFNs, as other models' layers there: up to PER_TOKEN_MAX_TOKENS tokens per
        pass, each its one-token numbers (the recurrent kernels take one row per token, each over its
        own slot's state: graph replays of several sequences' steps, `Engine.decode_batch`)."""
        if self.backend == "cpu" and self._dense() and self._batch_invariant_products():
            return DecodeRoute("cpu:torch-layer-per-token", self._token_steps, True, None, False)
        if self.backend == "cuda" and self._dense():
            name = "cuda:torch-layer-per-token"
            return DecodeRoute(name, self._layer_per_token, True, PER_TOKEN_MAX_TOKENS, False)
        return self.torch_layers_route()

    def _dense(self) -> bool:
        """Every FFN the dense SwiGLU (expert routing is not batch-invariant)."""
        return all(isinstance(layer.ffn, GatedFFN) for layer in self.layers)

    def _batch_invariant_products(self) -> bool:
        mixers = [self.layers[i].attn for i in self.recurrent_layers]
        linears = [*self._linears(), *(linear for mixer in mixers for linear in mixer.linears())]
        return all(linear.kernel.batch_invariant for linear in linears)

    def _token_steps(
        self,
        index: int,
        x: torch.Tensor,
        rope_tables: tuple[torch.Tensor, torch.Tensor] | None,
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
    ) -> torch.Tensor:
        if isinstance(start_pos, int) and x.shape[0] > 1:
            start_pos = TokenPositions(start_pos)
        return self.layers[index](x, rope_tables, cache, index, slot, start_pos)

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
        layer = self.layers[index]
        rope_tables = tables.get(layer.attn.rope)
        if x.shape[0] == 1 or per_token:
            return self.decode_route.step(index, x, rope_tables, cache, slot, start_pos)
        return layer(x, rope_tables, cache, index, slot, start_pos)

    def final_hidden(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slot: int,
        start_pos: int | DevicePosition,
        per_token: bool = False,
    ) -> torch.Tensor:
        """As `DecoderModel.final_hidden`; a pass from position 0 starts the slot's recurrent state afresh,
        any other continues it (so it must continue the sequence the state holds): here at a host
        position, in the recurrent kernels at a `DevicePosition` (`GatedDeltaNet.__call__`). A step of
        several sequences (a `DevicePosition` with slots) continues every row's: the caller clears the
        slots of rows at position 0 first (`GraphDecoder.decode_rows`)."""
        if cache.recurrent is None:
            raise TypeError(f"{self.config.architecture} needs the cache of its new_cache (recurrent state)")
        if not isinstance(start_pos, DevicePosition):
            cache.recurrent.start(slot, start_pos)
        return super().final_hidden(tokens, cache, slot, start_pos, per_token)

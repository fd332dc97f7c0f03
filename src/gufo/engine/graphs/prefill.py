"""Prefill chunks replayed as captured CUDA graphs, cut at the attention (piecewise graphs).

Launched op by op, a prefill chunk costs ~30 launches per layer from Python, and on a slow host those
launches take longer than the GPU needs for them (docs/decisions.md, "Prefill replays piecewise CUDA
graphs"). Everything in a layer but the attention over the cache depends only on the chunk's length:
positions live in a static device tensor, which the RoPE tables and the KV writes read. So each graph
runs one layer's tail and the next layer's head (output projection, residual adds, FFN; then norm, QKV
product, QK norm, RoPE and the KV write), and the attention over the cache prefix, whose length changes
from chunk to chunk, runs eagerly between two graphs: per layer, one replay and a few launches.

Graphs are kept per (slot, chunk length) and share one memory pool. They replay the same kernels on the
same values as the eager layers, so their logits are bit-identical to the eager prefill.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from gufo.engine.graphs.decode import record
from gufo.models.base import DecoderLayer, DecoderModel, GatedFFN, SelfAttention
from gufo.models.kv_cache import KVCache
from gufo.models.layers import attend_cached
from gufo.models.rope import Rope

log = logging.getLogger(__name__)


@dataclass
class _Buffers:
    """The static tensors one chunk length's graphs read and write."""

    positions: torch.Tensor  # [T] int64: cache positions of the chunk's tokens
    tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]]  # RoPE cos/sin [T, dim] per rope
    hidden: torch.Tensor  # [T, n_embd]: the residual stream between layers
    query: torch.Tensor  # [T, n_heads, key_dim]: this layer's rotated queries
    mixed: torch.Tensor  # [T, n_heads * value_dim]: this layer's attention output


class PrefillGraphs:
    def __init__(self, model: DecoderModel, cache: KVCache, device: torch.device):
        self.model, self.cache, self.device = model, cache, device
        self.pool = torch.cuda.graph_pool_handle()
        self.buffers: dict[int, _Buffers] = {}
        self.graphs: dict[tuple[int, int], list[torch.cuda.CUDAGraph]] = {}
        self.capture_seconds = 0.0

    @staticmethod
    def supports(model: DecoderModel) -> bool:
        """Whether every layer is plain attention + dense gated FFN (hybrid token mixers keep state
        that a replay would advance; expert routing may read values on the host), with no prefill tap
        (a debug hook that runs on the host between layers)."""
        return not model.prefill_taps and all(
            type(layer) is DecoderLayer
            and type(layer.attn) is SelfAttention
            and isinstance(layer.ffn, GatedFFN)
            for layer in model.layers
        )

    def _buffers(self, n_tokens: int) -> _Buffers:
        if n_tokens not in self.buffers:
            cfg, dev = self.model.config, self.device
            tables = {
                rope: (
                    torch.empty(n_tokens, rope.dim, device=dev),
                    torch.empty(n_tokens, rope.dim, device=dev),
                )
                for rope in self.model.ropes
            }  # filled per chunk by `hidden`
            self.buffers[n_tokens] = _Buffers(
                torch.zeros(n_tokens, dtype=torch.long, device=dev),
                tables,
                torch.zeros(n_tokens, cfg.n_embd, device=dev),
                torch.zeros(n_tokens, cfg.n_heads, cfg.key_dim, device=dev),
                torch.zeros(n_tokens, cfg.n_heads * cfg.value_dim, device=dev),
            )
        return self.buffers[n_tokens]

    def _piece(self, index: int, slot: int, buf: _Buffers) -> None:
        """Layer index - 1's tail and layer index's head (either missing at the ends), on the buffers."""
        layers = self.model.layers
        if index > 0:
            before = layers[index - 1]
            buf.hidden.copy_(before.post_attention(buf.hidden, before.attn.o(buf.mixed)))
        if index < len(layers):
            layer = layers[index]
            attn = layer.attn
            _, normed = layer.pre_attention(buf.hidden)
            q, k, v = attn.heads(*attn.qkv(normed), buf.tables[attn.rope])
            self.cache.write(index, slot, buf.positions, k, v)
            buf.query.copy_(q)

    def _attend(self, index: int, slot: int, end: int, buf: _Buffers) -> None:
        """Layer index's attention over its cache entries up to `end`, eagerly (its length varies)."""
        attn = self.model.layers[index].attn
        keys, values = self.cache.keys[index][slot], self.cache.values[index][slot]
        buf.mixed.copy_(
            attend_cached(buf.query, keys, values, end, attn.scale, attn.window, attn.kernels.prefill)
        )

    def _capture(self, slot: int, end: int, buf: _Buffers) -> list[torch.cuda.CUDAGraph]:
        """Run the chunk piece by piece, capturing each piece right after running it for real."""
        started = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        graphs = []
        with torch.cuda.stream(side):
            for index in range(len(self.model.layers) + 1):
                self._piece(index, slot, buf)  # the chunk's real work; also compiles and allocates
                graph = torch.cuda.CUDAGraph()  # recorded only: the run above did the work
                record(graph, self.pool, lambda index=index: self._piece(index, slot, buf))
                graphs.append(graph)
                if index < len(self.model.layers):
                    self._attend(index, slot, end, buf)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.capture_seconds += time.perf_counter() - started
        log.debug("captured prefill graphs slot=%d tokens=%d", slot, buf.positions.shape[0])
        return graphs

    def hidden(self, tokens: torch.Tensor, slot: int, start: int) -> torch.Tensor:
        """The residual stream after the last layer [T, n_embd] for `tokens` at positions start..;
        writes their KV like the eager layers. The result is a static buffer: use it before the next call."""
        n_tokens = tokens.shape[0]
        buf = self._buffers(n_tokens)
        buf.positions.copy_(torch.arange(start, start + n_tokens))
        for rope, (cos, sin) in buf.tables.items():
            table_cos, table_sin = self.model.rope_tables(rope, start, n_tokens, self.cache)
            cos.copy_(table_cos)
            sin.copy_(table_sin)
        buf.hidden.copy_(self.model.embed(tokens))
        end, key = start + n_tokens, (slot, n_tokens)
        if key not in self.graphs:
            self.graphs[key] = self._capture(slot, end, buf)
            return buf.hidden
        for index, graph in enumerate(self.graphs[key]):
            graph.replay()
            if index < len(self.model.layers):
                self._attend(index, slot, end, buf)
        return buf.hidden

    def release(self) -> None:
        torch.cuda.synchronize(self.device)
        for graphs in self.graphs.values():
            for graph in graphs:
                graph.reset()
        self.graphs.clear()

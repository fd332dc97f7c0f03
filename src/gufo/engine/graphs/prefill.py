"""Prefill chunks replayed as captured CUDA graphs, cut at the attention (piecewise graphs).

Launched op by op, a prefill chunk costs ~30 launches per layer from Python, and on a slow host those
launches take longer than the GPU needs for them (docs/decisions.md, "Prefill replays piecewise CUDA
graphs"). Everything in a layer but the attention over the cache depends only on the chunk's length:
positions and the slot live in static device tensors, which the RoPE tables and the KV writes read. So
each graph runs one layer's tail and the next layer's head (output projection, residual adds, FFN; then
norm, QKV product, QK norm, RoPE and the KV write), and the attention over the cache prefix, whose length
and slot change from chunk to chunk, runs eagerly between two graphs: per layer, one replay and a few
launches. One set of graphs per chunk length serves every slot; they share one memory pool.

A chunk shorter than its bucket (`gufo.engine.graphs.chunks`) is padded with token 0 rows at the
positions after it. A chunk of exactly a bucket's length replays the same kernels on the same values as
the eager layers, so its logits are bit-identical to the eager prefill. A padded chunk's products run on
more rows, so its numbers are the bucket's, not the eager chunk's; but the bucket is a function of the
chunk's length alone, and the scheduler cuts chunks at multiples of --prefill-chunk (absolute positions),
so chunk lengths, buckets and therefore every token's numbers are a function of the request alone, as
greedy output must be (docs/decisions.md, "Greedy output is a function of the request alone"); so is the
eager fallback of a chunk whose bucket would pass the context (its position and length). No real row
reads a padding row (every op but the attention works row by row, and the attention takes the real rows
only), and the padding rows are themselves a function of the chunk (token 0, their positions, attention
output zero), so stale buffer contents never reach the numbers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gufo.engine.graphs.decode import record
from gufo.models.base import DecoderLayer, DecoderModel, GatedFFN, SelfAttention
from gufo.models.kv_cache import KVCache
from gufo.models.layers import attend_cached
from gufo.models.rope import Rope

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    """One sequence's chunk among the rows of a replay: `n_tokens` rows from `row`, at positions
    `start`.. of `slot`."""

    slot: int
    start: int
    n_tokens: int
    row: int


@dataclass(frozen=True)
class _Rows:
    """What one replay's rows hold: token ids, cache positions and slots [size] on the host, and the
    RoPE tables' rows per rope."""

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]]


@dataclass
class _Buffers:
    """The static tensors one chunk length's graphs read and write."""

    positions: torch.Tensor  # [T] int64: cache positions of the chunk's tokens (padding rows' too)
    slots: torch.Tensor  # [T] int64: the chunk's slot on every row, read by the KV writes
    tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]]  # RoPE cos/sin [T, dim] per rope
    hidden: torch.Tensor  # [T, n_embd]: the residual stream between layers
    query: torch.Tensor  # [T, n_heads, key_dim]: this layer's rotated queries
    mixed: torch.Tensor  # [T, n_heads * value_dim]: this layer's attention output


class PrefillGraphs:
    def __init__(self, model: DecoderModel, cache: KVCache, device: torch.device):
        self.model, self.cache, self.device = model, cache, device
        self.pool = torch.cuda.graph_pool_handle()
        self.buffers: dict[int, _Buffers] = {}
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}  # by chunk length (bucket)
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

    def _buffers(self, size: int) -> _Buffers:
        if size not in self.buffers:
            cfg, dev = self.model.config, self.device
            tables = {
                rope: (torch.empty(size, rope.dim, device=dev), torch.empty(size, rope.dim, device=dev))
                for rope in self.model.ropes
            }  # filled per chunk by `hidden`
            self.buffers[size] = _Buffers(
                torch.zeros(size, dtype=torch.long, device=dev),
                torch.zeros(size, dtype=torch.long, device=dev),
                tables,
                torch.zeros(size, cfg.n_embd, device=dev),
                torch.zeros(size, cfg.n_heads, cfg.key_dim, device=dev),
                torch.zeros(size, cfg.n_heads * cfg.value_dim, device=dev),
            )
        return self.buffers[size]

    def _piece(self, index: int, buf: _Buffers) -> None:
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
            # the slot is device data: every row writes into slots[row] (`slot` unused with `slots`)
            self.cache.write(index, 0, buf.positions, k, v, slots=buf.slots)
            buf.query.copy_(q)

    def _attend(self, index: int, parts: Sequence[Segment], buf: _Buffers) -> None:
        """Layer index's attention for each part's own rows over its slot's entries up to its end,
        eagerly (their lengths vary): exactly the eager layer's call, one per part. The padding rows get
        none: their `mixed` rows stay zero (`_replay`)."""
        attn = self.model.layers[index].attn
        prefill = attn.kernels.prefill
        for part in parts:
            rows = slice(part.row, part.row + part.n_tokens)
            end = part.start + part.n_tokens
            keys, values = self.cache.entries(index, part.slot, end)
            mixed = attend_cached(buf.query[rows], keys, values, end, attn.scale, attn.window, prefill)
            buf.mixed[rows].copy_(mixed)

    def _capture(self, parts: Sequence[Segment], buf: _Buffers) -> list[torch.cuda.CUDAGraph]:
        """Run the chunk piece by piece, capturing each piece right after running it for real."""
        started = time.perf_counter()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        graphs = []
        with torch.cuda.stream(side):
            for index in range(len(self.model.layers) + 1):
                self._piece(index, buf)  # the chunk's real work; also compiles and allocates
                graph = torch.cuda.CUDAGraph()  # recorded only: the run above did the work
                record(graph, self.pool, lambda index=index: self._piece(index, buf))
                graphs.append(graph)
                if index < len(self.model.layers):
                    self._attend(index, parts, buf)
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.capture_seconds += time.perf_counter() - started
        log.debug("captured prefill graphs tokens=%d", buf.positions.shape[0])
        return graphs

    def hidden(self, tokens: torch.Tensor, slot: int, start: int, size: int) -> torch.Tensor:
        """The residual stream after the last layer [T, n_embd] for `tokens` at positions start.., through
        the graphs of chunks of `size` tokens (T <= size, start + size within the context: the caller's
        `chunks.replay_size`); writes their KV like the eager layers. The result is a view of a static
        buffer: use it before the next call.

        The size - T padding rows write KV at positions start + T.. start + size - 1 of the slot, past the
        prompt's tokens so far. Nothing reads an entry there before the token at that position writes it:
        the chunk's own attention (`_attend`) reads entries below start + T only; the next chunk or decode
        step at position p writes entry p before its attention reads it, and reads no later entries (the
        prefill attention's causal mask; decode attention loads entries 0..index only, `visible` and the
        Triton kernel's `ok` mask); and a cached prefix (snapshots, prefix reuse) covers positions below the
        sequence's length. Stale entries past a sequence's end already occur for the same reason
        (rejected drafts, `KVCache.restore`). Padding rows past the slot's pages write to the trash page."""
        self.cache.reserve(slot, start, start + tokens.shape[0])
        return self._replay(tokens, slot, start, size)

    def _replay(self, tokens: torch.Tensor, slot: int, start: int, size: int) -> torch.Tensor:
        """`hidden` at positions whose pages are reserved (or, for a warm-up, written to trash)."""
        n_tokens = tokens.shape[0]
        padded = torch.zeros(size, dtype=torch.long)
        padded[:n_tokens] = tokens
        slots = torch.full((size,), slot, dtype=torch.long)
        tables = {rope: self.model.rope_tables(rope, start, size, self.cache) for rope in self.model.ropes}
        rows = _Rows(padded, torch.arange(start, start + size), slots, tables)
        return self._run(rows, [Segment(slot, start, n_tokens, 0)], size)

    def hidden_parts(self, parts: Sequence[Segment], tokens: torch.Tensor, size: int) -> torch.Tensor:
        """`hidden` for the chunks of several sequences in one replay of `size` rows: `tokens` [T] are
        the parts' tokens one part after another (T <= size), part i on rows parts[i].row.. at positions
        parts[i].start.. of parts[i].slot, each part's pages reserved by the caller. Each row's numbers
        are those its own chunk gets alone (`hidden`) where the products keep a row's numbers at any row
        count past the skinny routes (what `Engine.packs_prefill` asks for), and those of any chunking of
        its prompt where the attention is chunk-invariant too (`Engine.tiled_prefill`, which runs every
        chunk through here). The padding rows go to the cache's scratch slot, whose writes land on the
        trash page."""
        scratch = self.cache.scratch_slot
        if scratch is None:
            raise RuntimeError("packed prefill needs the cache's scratch slot for its padding rows")
        n_pad = size - tokens.shape[0]
        pad = torch.zeros(n_pad, dtype=torch.long)
        padded = torch.cat([tokens, pad])
        positions = torch.cat([*(torch.arange(p.start, p.start + p.n_tokens) for p in parts), pad])
        slots = torch.cat([*(torch.full((p.n_tokens,), p.slot) for p in parts), pad + scratch])
        tables = {}
        for rope in self.model.ropes:
            pieces = [self.model.rope_tables(rope, p.start, p.n_tokens, self.cache) for p in parts]
            pad_cos, pad_sin = self.model.rope_tables(rope, 0, 1, self.cache)  # the padding rows: position 0
            tables[rope] = (
                torch.cat([*(cos for cos, _ in pieces), pad_cos.expand(n_pad, -1)]),
                torch.cat([*(sin for _, sin in pieces), pad_sin.expand(n_pad, -1)]),
            )
        rows = _Rows(padded, positions, slots, tables)
        return self._run(rows, parts, size)

    def _run(self, rows: _Rows, parts: Sequence[Segment], size: int) -> torch.Tensor:
        """The replay (a capture, the first time for `size`) of `rows` with each part's attention between
        the graphs: the residual stream of the parts' rows, a view of the static buffer."""
        buf = self._buffers(size)
        n_tokens = sum(part.n_tokens for part in parts)
        buf.positions.copy_(rows.positions)
        buf.slots.copy_(rows.slots)
        for rope, (cos, sin) in buf.tables.items():
            cos.copy_(rows.tables[rope][0])
            sin.copy_(rows.tables[rope][1])
        buf.hidden.copy_(self.model.embed(rows.tokens))
        buf.mixed[n_tokens:].zero_()  # the padding rows' attention output, which `_attend` leaves alone
        if size not in self.graphs:
            self.graphs[size] = self._capture(parts, buf)
            return buf.hidden[:n_tokens]
        for index, graph in enumerate(self.graphs[size]):
            graph.replay()
            if index < len(self.model.layers):
                self._attend(index, parts, buf)
        return buf.hidden[:n_tokens]

    def prepare(self, sizes: Sequence[int]) -> None:
        """Capture the graphs of chunks of each of `sizes` tokens now, each on rows of token 0 that write
        the trash page: the cache's scratch slot at position 0 where it has one (one row attended there,
        so that the attention's kernels compile now too, not in a first prompt), else positions 0.. of
        slot 0 (call it before any sequence is in slot 0: at load, when the slot holds no pages)."""
        started, before = time.perf_counter(), self.capture_seconds
        missing = [size for size in sizes if size not in self.graphs]
        scratch = self.cache.scratch_slot
        for size in missing:
            if scratch is not None:
                self.hidden_parts([Segment(scratch, 0, 1, 0)], torch.zeros(1, dtype=torch.long), size)
            else:
                self._replay(torch.zeros(size, dtype=torch.long), 0, 0, size)
        torch.cuda.synchronize(self.device)
        if missing:
            log.info(
                "captured prefill graphs for chunks of %s tokens in %.2f s (%.2f s capturing)",
                ", ".join(map(str, missing)),
                time.perf_counter() - started,
                self.capture_seconds - before,
            )

    def release(self) -> None:
        torch.cuda.synchronize(self.device)
        for graphs in self.graphs.values():
            for graph in graphs:
                graph.reset()
        self.graphs.clear()

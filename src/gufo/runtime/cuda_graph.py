"""One-token decode steps captured as CUDA graphs (torch's graph API also drives HIP graphs on ROCm).

Launching a decode step op by op costs more host time than the GPU needs for it. A captured step is
replayed with one call: the token id and the position live in static device tensors, and attention
reads a fixed prefix of the cache (`span`, from `gufo.kernels.attention.decode_span`) masked beyond
the position, so one graph serves every position below its span. Graphs are captured lazily per
(slot, span) and share one memory pool; the only host synchronisation of a step is reading its logits
back.
"""

from __future__ import annotations

import logging
import time

import torch

from gufo.kernels.attention import decode_span
from gufo.models.base import DecoderModel
from gufo.models.layers import DevicePosition
from gufo.runtime.kv_cache import KVCache

log = logging.getLogger(__name__)


class GraphDecoder:
    def __init__(self, model: DecoderModel, cache: KVCache, device: torch.device):
        self.model, self.cache, self.device = model, cache, device
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.index = torch.zeros(1, dtype=torch.long, device=device)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0

    def span(self, position: int) -> int:
        return decode_span(position, self.cache.context)

    def _forward(self, slot: int, span: int) -> torch.Tensor:
        return self.model.forward(self.token, self.cache, slot, DevicePosition(self.index, span))[-1]

    def _capture(self, slot: int, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        started = time.perf_counter()
        # recurrent state advances on every run, unlike KV writes: the replay must start from it unchanged
        saved = None if self.cache.recurrent is None else self.cache.recurrent.save(slot)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # warm-up outside the graph: lazy allocations, kernel autotuning
            self._forward(slot, span)
        torch.cuda.current_stream(self.device).wait_stream(side)
        if saved is not None:
            self.cache.recurrent.load(slot, saved)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(slot, span)
        self.capture_seconds += time.perf_counter() - started
        log.debug("captured decode graph slot=%d span=%d", slot, span)
        return graph, logits

    def release(self) -> None:
        """Free every captured graph (they are captured again on demand)."""
        torch.cuda.synchronize(self.device)
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()

    def decode(self, token: int, position: int, slot: int) -> torch.Tensor:
        """Logits (on the device) of `token` at `position`; writes its KV like an eager step."""
        span = self.span(position)
        # The warm-up of a capture runs a real step: set the inputs first so it writes the right KV.
        self.token.fill_(token)
        self.index.fill_(position)
        key = (slot, span)
        if key not in self.graphs:
            self.graphs[key] = self._capture(slot, span)
        graph, logits = self.graphs[key]
        graph.replay()
        return logits

"""Decode steps captured as CUDA graphs (torch's graph API also drives HIP graphs on ROCm).

Launching a decode step op by op costs more host time than the GPU needs for it. A captured step is
replayed with one call: the token ids and positions live in static device tensors, and decode attention
bounds each token's cache span by its position on the device, so one graph serves every position.
Graphs are captured lazily per (slot, number of tokens): one token for plain decoding, several for
verifying speculative drafts (the decode-layer kernel gives each token its one-token numbers), and per
number of rows for one step of several sequences (a server's batch: each row's slot is a device tensor
too, so one graph serves any set of slots; past 16 rows, per bucket of rows: `rows`). They share one
memory pool; the only host synchronisation of a step is reading its logits back. Once a proposer reads
the trunk's hidden state (multi-token prediction, `keep_hidden`), each graph also hands out its last
layer's output rows, from a static buffer of its own.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch

from gufo.engine.graphs import rows
from gufo.kernels.staging import staged
from gufo.models.base import DecoderModel
from gufo.models.kv_cache import KVCache
from gufo.models.layers import DevicePosition

log = logging.getLogger(__name__)
T = TypeVar("T")
Outputs = tuple[torch.Tensor, torch.Tensor | None]  # a step's logits, and its hidden rows where kept
Checkpoints = list[list[torch.Tensor]]  # per token, a recurrent state's copy (`RecurrentState.save`)
ROWS = -1  # the graphs' slot key of steps of several sequences (their slots are device inputs)


def record(graph: torch.cuda.CUDAGraph, pool: tuple, run: Callable[[], T]) -> T:
    """Capture run() into graph (on the current stream, which must not be the default one), its
    allocations from `pool`; returns what run returned (the graph's output tensors). capture_begin/end
    rather than torch.cuda.graph(), whose synchronize and empty_cache made each capture cost ~0.1 s
    (cached blocks freed, then allocated again)."""
    graph.capture_begin(pool=pool)
    try:
        return run()
    finally:
        graph.capture_end()


class GraphDecoder:
    def __init__(
        self,
        model: DecoderModel,
        cache: KVCache,
        device: torch.device,
        max_tokens: int = 1,
        capture: bool = True,
    ):
        """`capture` False runs each step a graph would replay uncaptured, op by op from Python (the
        kernels a replay runs, each launch seen by a profiler's ranges: `gufo profile`)."""
        self.model, self.cache, self.device = model, cache, device
        self.max_tokens = max_tokens
        self.capture = capture
        # token ids, positions, and the slots of a step of several sequences
        self.inputs = torch.zeros(3, max_tokens, dtype=torch.long, device=device)
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        # (slot, tokens) of one sequence's step, (ROWS, rows) of a step of several: graph, logits, hidden
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Outputs]] = {}
        self.capture_seconds = 0.0
        self.keeps_hidden = False  # whether steps hand out their hidden rows too (`keep_hidden`)
        self.hidden: torch.Tensor | None = None  # the latest step's hidden rows, while `keeps_hidden`

    def keep_hidden(self) -> None:
        """From now on each step also hands out the last layer's output rows [T, n_embd] (before the
        output norm) in `hidden`; graphs captured before, which do not write them, are dropped."""
        if not self.keeps_hidden:
            if self.graphs:
                self.release()
            self.keeps_hidden = True

    def _forward(self, slot: int, n_tokens: int) -> Outputs:
        tokens, index = self.inputs[0, :n_tokens], self.inputs[1, :n_tokens]
        if slot == ROWS:  # the pass's slot is not read: each row's is in the inputs
            slot, where = 0, DevicePosition(index, self.inputs[2, :n_tokens])
        else:
            where = DevicePosition(index)
        if not self.keeps_hidden:
            return self.model.forward(tokens, self.cache, slot, where, all_logits=True, per_token=True), None
        hidden = self.model.final_hidden(tokens, self.cache, slot, where, per_token=True)
        return self.model.head(hidden, all_logits=True), hidden

    def _capture(self, slot: int, n_tokens: int) -> tuple[torch.cuda.CUDAGraph, Outputs]:
        started = time.perf_counter()
        # recurrent state advances on every run, unlike KV writes: the replay must start from it unchanged
        stepped = self.inputs[2, :n_tokens].tolist() if slot == ROWS else [slot]
        saved = self._saved_states(stepped)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(side):
            self._forward(slot, n_tokens)  # warm-up outside the graph: lazy allocations, kernel autotuning
            self._load_states(saved)
            outputs = record(graph, self.pool, lambda: self._forward(slot, n_tokens))
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.capture_seconds += time.perf_counter() - started
        log.debug("captured decode graph slot=%d tokens=%d", slot, n_tokens)
        return graph, outputs

    def _saved_states(self, slots: Sequence[int]) -> list[tuple[int, list[torch.Tensor]]]:
        """Copies of the recurrent state of `slots` (none without recurrent state)."""
        recurrent = self.cache.recurrent
        return [] if recurrent is None else [(slot, recurrent.save(slot)) for slot in slots]

    def _load_states(self, saved: list[tuple[int, list[torch.Tensor]]]) -> None:
        for slot, state in saved:
            self.cache.recurrent.load(slot, state)

    def prepare(self, slot: int, n_tokens: int, checkpoints: Checkpoints | None = None) -> None:
        """Capture the graphs of 1..n_tokens tokens on `slot` now (their warm-ups write KV at the end of
        the context, to the trash page unless the slot holds a page there), so timed steps replay them;
        `checkpoints` as `decode`'s."""
        context = self.cache.context
        for count in range(1, min(n_tokens, self.max_tokens, context) + 1 if self.capture else 0):
            if (slot, count) not in self.graphs:
                self.inputs[0, :count].zero_()
                self.inputs[1, :count].copy_(torch.arange(context - count, context))
                with self._keeping_steps(slot, count, checkpoints):
                    self.graphs[slot, count] = self._capture(slot, count)

    def release(self) -> None:
        """Free every captured graph (they are captured again on demand)."""
        torch.cuda.synchronize(self.device)
        for graph, _ in self.graphs.values():
            graph.reset()
        self.graphs.clear()

    def decode(
        self,
        tokens: Sequence[int] | torch.Tensor,
        position: int,
        slot: int,
        checkpoints: Checkpoints | None = None,
    ) -> torch.Tensor:
        """Logits [T, vocab] (on the device) of consecutive `tokens` from `position`; writes their KV
        like eager steps. T is at most `max_tokens`. With recurrent state, `checkpoints` (at least T - 1
        buffers laid out as `RecurrentState.save`'s) receive the slot's state after each token but the
        last, in the same pass (`RecurrentState.keep_steps`): a graph writes into the buffers it was
        captured with, so a slot's must stay the same tensors from call to call. One token may be an id
        tensor on the device (`Engine.decode_batch`)."""
        n_tokens = len(tokens)
        if not 0 < n_tokens <= self.max_tokens:
            raise ValueError(f"{n_tokens} tokens in one graph step (1 to {self.max_tokens})")
        self.cache.reserve(slot, position, position + n_tokens)
        # The warm-up of a capture runs a real step: set the inputs first so it writes the right KV.
        if n_tokens == 1:  # no host synchronisation: the values travel as kernel arguments
            if isinstance(tokens, torch.Tensor):
                self.inputs[0, :1].copy_(tokens)
            else:
                self.inputs[0, 0].fill_(tokens[0])
            self.inputs[1, 0].fill_(position)
        else:  # one copy (drafts are verified after the previous step's logits were read anyway)
            given = torch.tensor([list(tokens), list(range(position, position + n_tokens))])
            self.inputs[:2, :n_tokens].copy_(given)  # the slots row is only a batch's
        with self._keeping_steps(slot, n_tokens, checkpoints):
            return self._run(slot, n_tokens)

    @contextlib.contextmanager
    def _keeping_steps(self, slot: int, n_tokens: int, checkpoints: Checkpoints | None) -> Iterator[None]:
        """The recurrent state's `keep_steps` of a step of `n_tokens` tokens on `slot`, for its duration."""
        if checkpoints is None or n_tokens == 1:
            yield
            return
        self.cache.recurrent.keep_steps(slot, checkpoints[: n_tokens - 1])
        try:
            yield
        finally:
            self.cache.recurrent.keep_steps(slot, None)

    def decode_rows(
        self, tokens: Sequence[int] | torch.Tensor, positions: Sequence[int], slots: Sequence[int]
    ) -> torch.Tensor:
        """Logits [B, vocab] (on the device) of one step of B sequences: token i at positions[i] of slot
        slots[i] (distinct slots), writing their KV like eager steps; B is at most `max_tokens`. Each row
        runs the kernels of its own one-token step, which give it its one-token numbers; the graph of
        the row count's bucket runs them (`rows.bucket`), its spare rows on the cache's scratch slot. A
        row at position 0 starts its slot's recurrent state afresh (cleared here: the step continues each).
        `tokens` may be ids on the device. The inputs travel from pinned memory without waiting for
        the device: a copy from pageable memory would first wait for every step queued before."""
        self.cache.reserve_rows(slots, positions)
        return self._rows_step(tokens, positions, slots)

    def _rows_step(
        self, tokens: Sequence[int] | torch.Tensor, positions: Sequence[int], slots: Sequence[int]
    ) -> torch.Tensor:
        """`decode_rows` at positions whose pages are reserved (or, for a warm-up, written to trash)."""
        n_rows = len(tokens)
        size = rows.bucket(n_rows, self.max_tokens)
        if self.cache.recurrent is not None:
            for slot, position in zip(slots, positions, strict=True):
                self.cache.recurrent.start(slot, position)
        on_device = isinstance(tokens, torch.Tensor)
        given = rows.padded(
            [0] * n_rows if on_device else tokens, positions, slots, size, self.cache.scratch_slot
        )
        self.inputs[:, :size].copy_(staged(given, self.inputs.device), non_blocking=True)
        if on_device:
            self.inputs[0, :n_rows].copy_(tokens)
        return self._run(ROWS, size)[:n_rows]

    def prepare_rows(self, n_rows: int) -> None:
        """Capture the graphs of steps of 2..n_rows sequences now, one per bucket (one sequence steps on
        its own slot's graph; the warm-ups hold no pages, so their KV writes go to the trash page, and
        they keep those slots' recurrent state)."""
        context, most = self.cache.context, min(n_rows, self.max_tokens, self.cache.n_slots)
        sizes = rows.buckets(self.max_tokens) if self.capture and most > 1 else ()
        for size in sizes[1 : sizes.index(rows.bucket(most, self.max_tokens)) + 1]:
            if (ROWS, size) not in self.graphs:
                count = min(size, most)  # the rest of the bucket pads
                saved = self._saved_states(range(count))
                self._rows_step([0] * count, [context - 1] * count, range(count))
                self._load_states(saved)

    def _run(self, slot: int, n_tokens: int) -> torch.Tensor:
        """The logits of the step of `n_tokens` tokens on `slot` (ROWS: one row per slot in the inputs),
        replayed from its graph (captured on first use), or run op by op without capture; its hidden
        rows go to `hidden` where kept."""
        if not self.capture:
            logits, self.hidden = self._forward(slot, n_tokens)
            return logits
        key = (slot, n_tokens)
        if key not in self.graphs:
            self.graphs[key] = self._capture(slot, n_tokens)
        graph, (logits, self.hidden) = self.graphs[key]
        graph.replay()
        return logits

"""Leader and followers: rank 0 runs the command (tokenizes, samples, prints, serves HTTP) and, before
each step that touches the model, the KV cache or the thread pool, broadcasts it on the control group;
the other ranks run the same steps on their shards, so every collective in the forward meets its
partners. Messages are HEADER int64s (op, then fields), token ids follow as one more broadcast.
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from gufo.engine.memory import peak_memory_bytes
from gufo.models.kv_cache import CacheSnapshot
from gufo.parallel.process_group import HEADER, TensorParallel

if TYPE_CHECKING:
    from gufo.engine.engine import Engine

log = logging.getLogger(__name__)

STOP, FORWARD, DECODE, SNAPSHOT, RESTORE, THREADS, MEMORY, COPY, RELEASE = range(9)


class Leader:
    """Rank 0's side: one method per mirrored step."""

    def __init__(self, tp: TensorParallel, before_close: Callable[[], None]):
        self.tp = tp
        self.before_close = before_close  # releases captured graphs (see `Engine.release_graphs`)
        self.stopped = False
        atexit.register(self.stop)  # every exit (success, bad input, failure) releases the followers

    def _send(self, op: int, *fields: int) -> None:
        self.tp.broadcast_ints([op, *fields] + [0] * (HEADER - 1 - len(fields)), HEADER)

    def forward(
        self, tokens: Sequence[int], slot: int, start: int, all_logits: bool, per_token: bool
    ) -> None:
        self._send(FORWARD, slot, start, len(tokens), int(all_logits), int(per_token))
        self.tp.broadcast_ints(list(tokens), len(tokens))

    def decode(self, token: int, position: int, slot: int) -> None:
        self._send(DECODE, token, position, slot)

    def snapshot(self, slot: int, length: int) -> None:
        self._send(SNAPSHOT, slot, length)

    def restore(self, state: CacheSnapshot) -> None:
        self._send(RESTORE, state.slot, state.length)

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        self._send(COPY, source, target, length)

    def release_pages(self, slot: int, length: int) -> None:
        self._send(RELEASE, slot, length)

    def threads(self, count: int) -> None:
        self._send(THREADS, count)

    def memory(self, own: int) -> list[int]:
        self._send(MEMORY)
        return self.tp.gather_objects(own)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        try:
            self._send(STOP)
            self.before_close()
            self.tp.close()
        except RuntimeError as err:  # followers already gone (torchrun tears a failed launch down)
            log.warning("tensor parallel: could not stop the other ranks: %s", err)


@torch.inference_mode()
def follow(engine: Engine) -> int:
    """Run the leader's steps on this rank's shard until it stops; prints nothing. Exit code 0."""
    tp = engine.tensor_parallel_group
    # The leader restores a snapshot it took of (slot, length); a follower keeps its own copy under that key.
    snapshots: dict[tuple[int, int], CacheSnapshot] = {}
    while True:
        op, *fields = tp.broadcast_ints(None, HEADER)
        if op == STOP:
            engine.release_graphs()
            tp.close()
            return 0
        if op == FORWARD:
            slot, start, count, all_logits, per_token = fields[:5]
            tokens = torch.tensor(tp.broadcast_ints(None, count), dtype=torch.long)
            engine.forward(tokens, slot, start, bool(all_logits), bool(per_token))
        elif op == DECODE:
            engine.decode_step(*fields[:3])
        elif op == SNAPSHOT:
            snapshots[(fields[0], fields[1])] = engine.cache.snapshot(fields[0], fields[1])
        elif op == RESTORE:
            engine.cache.restore(snapshots[(fields[0], fields[1])])
        elif op == COPY:
            engine.cache.copy_prefix(*fields[:3])
        elif op == RELEASE:
            engine.release_pages(*fields[:2])
        elif op == THREADS:
            torch.set_num_threads(fields[0])
        elif op == MEMORY:
            tp.gather_objects(peak_memory_bytes(engine.device))
        else:
            raise RuntimeError(f"tensor-parallel follower: unknown command {op}")

"""A rank of a tensor-parallel launch: the Engine on this rank's shard, with rank 0 mirroring each
step that touches the model, the KV cache or the thread pool to the other ranks (gufo.parallel.mirror)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gufo.engine.engine import Engine
from gufo.engine.loader import LoadProgress
from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.models.kv_cache import CacheSnapshot
from gufo.models.registry import build_model
from gufo.options import DEFAULT_BATCH, RunOptions
from gufo.parallel.mirror import Leader
from gufo.parallel.model import build_sharded, preflight
from gufo.parallel.process_group import start


class ShardedEngine(Engine):
    # followers mirror plain steps only: no multi-token graph replays, no batched rows of several slots
    multi_token_graphs = False
    batched_rows = False

    def __init__(
        self,
        model: str | Path | None,
        tensor_parallel: int,
        options: RunOptions | None = None,
        context: int | None = None,
        n_slots: int = 1,
        batch_size: int = DEFAULT_BATCH,
        progress: LoadProgress | None = None,
        kv_memory: int | None = None,
    ):
        self.tensor_parallel = tensor_parallel
        super().__init__(model, options, context, n_slots, batch_size, progress, kv_memory)
        self.mirror = Leader(self.tensor_parallel_group, self.release_graphs) if not self.follows else None

    def _device(self, device: str) -> str:
        """Refuse a model that does not split N ways or a launch that is not N processes, then join the
        process group: its device is this rank's."""
        preflight(self.file, self.tensor_parallel)
        self.tensor_parallel_group = start(self.tensor_parallel, device)
        return self.tensor_parallel_group.device

    def _build(self, model_file: ModelFile, backend: str) -> Any:
        def shard(architecture: Any, mf: ModelFile, backend: str) -> Any:
            return build_sharded(architecture, mf, backend, self.tensor_parallel_group)

        return build_model(model_file, backend, shard)

    @property
    def follows(self) -> bool:
        """Whether this is a rank other than 0: it runs `gufo.parallel.mirror.follow`."""
        return not self.tensor_parallel_group.leader

    def forward(
        self, tokens: torch.Tensor, slot: int, start: int, all_logits: bool = False, per_token: bool = False
    ) -> torch.Tensor:
        if self.mirror is not None:
            self.mirror.forward(tokens.tolist(), slot, start, all_logits, per_token)
        return super().forward(tokens, slot, start, all_logits, per_token)

    def embed(self, tokens: Sequence[int], pooling: str = "mean") -> torch.Tensor:
        raise BadInputError(
            "embeddings are not supported with --tensor-parallel (the ranks would not follow)"
        )

    def decode_step(self, token: int | torch.Tensor, position: int, slot: int) -> torch.Tensor:
        if self.mirror is not None:  # the other ranks hear the id itself (a queued one is read here)
            self.mirror.decode(int(token), position, slot)
        return super().decode_step(token, position, slot)

    def snapshot(self, slot: int, length: int) -> CacheSnapshot:
        if self.mirror is not None:
            self.mirror.snapshot(slot, length)
        return super().snapshot(slot, length)

    def restore(self, state: CacheSnapshot) -> None:
        if self.mirror is not None:
            self.mirror.restore(state)
        super().restore(state)

    def copy_prefix(
        self, source: int, target: int, length: int, state: list[torch.Tensor] | None = None
    ) -> None:
        if self.mirror is not None:  # KV only: tensor parallelism splits no model with recurrent state
            self.mirror.copy_prefix(source, target, length)
        super().copy_prefix(source, target, length, state)

    def release_pages(self, slot: int, length: int) -> None:
        if self.mirror is not None:
            self.mirror.release_pages(slot, length)
        super().release_pages(slot, length)

    def set_threads(self, count: int) -> None:
        if self.mirror is not None:
            self.mirror.threads(count)
        super().set_threads(count)

    def rank_peak_memory(self) -> list[int]:
        own = super().rank_peak_memory()
        return self.mirror.memory(own[0]) if self.mirror is not None else own


def open_engine(
    model: str | Path | None,
    options: RunOptions,
    tensor_parallel: int = 1,
    context: int | None = None,
    n_slots: int = 1,
    batch_size: int = DEFAULT_BATCH,
    progress: LoadProgress | None = None,
    kv_memory: int | None = None,
) -> Engine:
    """An Engine, or this process's rank of a tensor-parallel launch when `tensor_parallel` > 1."""
    if tensor_parallel > 1:
        return ShardedEngine(
            model, tensor_parallel, options, context, n_slots, batch_size, progress, kv_memory
        )
    return Engine(model, options, context, n_slots, batch_size, progress, kv_memory)


def follows(engine: Engine) -> bool:
    """Whether `engine` is a tensor-parallel rank other than 0 (it runs rank 0's steps, prints nothing)."""
    return isinstance(engine, ShardedEngine) and engine.follows

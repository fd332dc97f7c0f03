"""Build one rank's shard of a model and hook the collectives onto it: an all-reduce after the
attention output projection and after the FFN down projection, an all-gather of the vocab-parallel
logits (every rank gets the full vocabulary, so sampling sees what a single process sees)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gufo.gguf.model_file import ModelFile
from gufo.parallel.process_group import TensorParallel, check_launch
from gufo.parallel.sharding import ShardedModelFile, plan_layout


def preflight(mf: ModelFile, n: int) -> None:
    """Refuse, as one line, a model that does not split N ways, then a launch that is not N processes."""
    plan_layout(mf, n)
    check_launch(n)


@dataclass
class VocabGather:
    tp: TensorParallel
    vocab: int
    shard: int  # rows per rank; the last rank's logits are padded up to it

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] < self.shard:
            logits = F.pad(logits, (0, self.shard - logits.shape[-1]))
        full = self.tp.all_gather_last(logits)
        return full if full.shape[-1] == self.vocab else full[..., : self.vocab]


def build_sharded(architecture: Any, mf: ModelFile, backend: str, tp: TensorParallel) -> Any:
    layout = plan_layout(mf, tp.world)
    model = architecture(ShardedModelFile(mf, layout, tp.rank), backend)
    for layer in model.layers:
        layer.attn.o.after = tp.all_reduce
        layer.ffn.down.after = tp.all_reduce
    model.output.after = VocabGather(tp, layout.vocab, layout.vocab_shard)
    return model

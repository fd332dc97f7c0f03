"""Megatron-style shard rules on GGUF tensors, and the view of the model file one rank loads.

Attention is split by KV-head group (each rank keeps whole KV heads and the query heads that read
them); with fewer KV heads than ranks, each KV head is replicated on the ranks that share its query
heads (as vLLM does), so a KV head is never cut and a rank's query heads all read one KV head. The
FFN's gate/up by output rows and its down projection by input columns, the attention output
projection by input columns, and the output projection by vocabulary rows. The token embedding and
every norm vector are replicated. A GGUF quantized row is a run of blocks along the input dimension:
a row split never cuts a block, a column split must be a multiple of the block size, else refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES

from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile, TensorInfo

TP_ARCHITECTURES = ("llama", "qwen3", "gemma3")  # the shared pre-norm block of models/base.py
OUTPUT, EMBEDDING = "output.weight", "token_embd.weight"
ROWS, COLUMNS = 0, 1


@dataclass(frozen=True)
class Split:
    axis: int  # ROWS (output features) or COLUMNS (input features)
    size: int  # per rank; the vocabulary's last rank may hold fewer rows
    replicas: int = 1  # consecutive ranks holding the same slice (replicated KV heads)


@dataclass(frozen=True)
class ShardLayout:
    """How a model of these (global) sizes splits over `world` ranks."""

    world: int
    n_heads: int
    n_kv_heads: int
    key_dim: int
    value_dim: int
    n_ff: int
    vocab: int

    @property
    def vocab_shard(self) -> int:
        return -(-self.vocab // self.world)

    @property
    def kv_per_rank(self) -> int:
        return max(1, self.n_kv_heads // self.world)

    @property
    def kv_replicas(self) -> int:
        """Ranks sharing each KV head: 1 unless there are fewer KV heads than ranks."""
        return max(1, self.world // self.n_kv_heads)

    def split(self, name: str) -> Split | None:
        """The rule for a tensor name; None = replicated."""
        w = self.world
        rules = {
            "attn_q.weight": Split(ROWS, self.n_heads // w * self.key_dim),
            "attn_k.weight": Split(ROWS, self.kv_per_rank * self.key_dim, self.kv_replicas),
            "attn_v.weight": Split(ROWS, self.kv_per_rank * self.value_dim, self.kv_replicas),
            "attn_output.weight": Split(COLUMNS, self.n_heads // w * self.value_dim),
            "ffn_gate.weight": Split(ROWS, self.n_ff // w),
            "ffn_up.weight": Split(ROWS, self.n_ff // w),
            "ffn_down.weight": Split(COLUMNS, self.n_ff // w),
        }
        # the biases of row-split products split with their rows; those of column-split products
        # (attn_output, ffn_down) are replicated and added once, after the all-reduce
        for stem in ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"):
            rules[f"{stem}.bias"] = rules[f"{stem}.weight"]
        if name == OUTPUT:
            return Split(ROWS, self.vocab_shard)
        if name.startswith("blk."):
            return rules.get(name.split(".", 2)[2])
        return None

    def local_keys(self) -> dict[str, int]:
        """Metadata one rank's model reads: its own head and FFN widths, the global head sizes."""
        return {
            "attention.head_count": self.n_heads // self.world,
            "attention.head_count_kv": self.kv_per_rank,
            "attention.key_length": self.key_dim,
            "attention.value_length": self.value_dim,
            "feed_forward_length": self.n_ff // self.world,
        }


def output_source(mf: ModelFile) -> str:
    """The output projection's tensor: its own, or the embedding when tied."""
    return OUTPUT if OUTPUT in mf.tensors else EMBEDDING


def plan_layout(mf: ModelFile, world: int) -> ShardLayout:
    """The layout for `world` ranks, or one BadInputError line naming what cannot be split."""
    if mf.architecture not in TP_ARCHITECTURES:
        raise BadInputError(
            f"{mf.label}: --tensor-parallel {world} supports the {', '.join(TP_ARCHITECTURES)} "
            f"architectures, not {mf.architecture}"
        )
    problem = _problem(mf, world)
    if problem is None:
        return _layout(mf, world)
    heads = _layout(mf, 1).n_heads
    valid = [n for n in range(2, heads + 1) if heads % n == 0 and _problem(mf, n) is None]
    hint = f"degrees that split it: {', '.join(map(str, valid))}" if valid else "no degree above 1 splits it"
    raise BadInputError(f"{mf.label}: --tensor-parallel {world} {problem}; {hint}")


def _layout(mf: ModelFile, world: int) -> ShardLayout:
    from gufo.models.base import ModelConfig  # models import this package lazily

    cfg = ModelConfig.from_file(mf)
    return ShardLayout(
        world, cfg.n_heads, cfg.n_kv_heads, cfg.key_dim, cfg.value_dim, cfg.n_ff, cfg.vocab_size
    )


def _problem(mf: ModelFile, world: int) -> str | None:
    """What makes a split over `world` ranks impossible, worded to follow "--tensor-parallel N"."""
    layout = _layout(mf, world)
    heads, kv = layout.n_heads, layout.n_kv_heads
    if heads % world or heads % kv or (kv % world and world % kv):
        # whole KV-head groups per rank, or whole shares of one replicated KV head's query heads
        return (
            f"cannot split {kv} KV head{'s' if kv != 1 else ''} ({heads} query heads, {heads // kv} per KV "
            f"head) into {world} equal groups"
        )
    if layout.n_ff % world:
        return f"cannot split the FFN width {layout.n_ff} into {world} equal parts"
    if layout.vocab <= (world - 1) * layout.vocab_shard:
        return f"leaves a rank without vocabulary rows ({layout.vocab} rows)"
    names = [*mf.tensors, OUTPUT] if OUTPUT not in mf.tensors else list(mf.tensors)
    for name in names:
        info = mf.tensors[output_source(mf) if name == OUTPUT else name]
        split = layout.split(name)
        if split is None:
            if name.startswith("blk.") and len(info.shape) > 1:
                return f"has no shard rule for {name}"
            continue
        extent = info.shape[split.axis]
        expected = layout.vocab if name == OUTPUT else split.size * world // split.replicas
        if extent != expected:
            axis = "rows" if split.axis == ROWS else "columns"
            return f"expects {expected} {axis} in {name}, it has {extent}"
        block = GGML_QUANT_SIZES[info.qtype][0]
        if split.axis == COLUMNS and split.size % block:
            return (
                f"would cut {info.qtype.name} blocks of {name}: each rank takes {split.size} of its {extent} "
                f"input columns, not a multiple of the block size {block}"
            )
    return None


def shard(info: TensorInfo, split: Split, rank: int) -> TensorInfo:
    """This rank's slice of a GGUF tensor (rows: a view of the map; columns: whole blocks, copied)."""
    start = rank // split.replicas * split.size
    stop = min(start + split.size, info.shape[split.axis])
    data = info.data.reshape(-1, info.data.shape[-1])
    if len(info.shape) == 1:  # a bias: whole elements
        width = info.n_bytes // info.shape[0]
        part = info.data[start * width : stop * width]
        return TensorInfo(info.name, info.qtype, (stop - start,), -1, part.nbytes, part)
    if split.axis == ROWS:
        part = data[start:stop]
        shape = (stop - start, info.shape[1])
    else:
        block_elems, block_bytes = GGML_QUANT_SIZES[info.qtype]
        first, last = start // block_elems * block_bytes, stop // block_elems * block_bytes
        part = np.ascontiguousarray(data[:, first:last])
        shape = (info.shape[0], stop - start)
    return TensorInfo(info.name, info.qtype, shape, -1, part.nbytes, part)


class ShardedModelFile:
    """A ModelFile as one rank sees it: its shard of every split tensor and its local head/FFN widths.

    The output projection is vocabulary-parallel even when tied to the (replicated) embedding, so the
    view always lists `output.weight` and serves the rank's rows of whichever tensor holds it.
    """

    def __init__(self, base: ModelFile, layout: ShardLayout, rank: int):
        self.base, self.layout, self.rank = base, layout, rank
        self.tensors = {**base.tensors, OUTPUT: base.tensors[output_source(base)]}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def optional_tensor(self, name: str) -> TensorInfo | None:
        return self.tensor(name) if name in self.tensors else None

    def tensor(self, name: str) -> TensorInfo:
        info = self.base.tensor(output_source(self.base) if name == OUTPUT else name)
        split = self.layout.split(name)
        return info if split is None else shard(info, split, self.rank)

    def arch_key(self, suffix: str, default: Any = ...) -> Any:
        local = self.layout.local_keys()
        return local[suffix] if suffix in local else self.base.arch_key(suffix, default)

"""Engine: a loaded model, its tokenizer and KV cache slots; prefill, decode and generation.

The CLI, the server and the benchmark all drive this object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

import torch

from gufo.engine.constraint import TokenConstraint
from gufo.engine.graphs.chunks import PACKED_MIN_TOKENS, pack_bucket, pack_sizes, prepared_sizes, replay_size
from gufo.engine.graphs.rows import EXACT_ROWS
from gufo.engine.loader import LoadProgress, load_model, open_checked
from gufo.engine.memory import default_kv_memory, peak_memory_bytes
from gufo.engine.sampling import Sampler, SamplingParams
from gufo.errors import BadInputError
from gufo.gguf.model_file import ModelFile
from gufo.kernels import backends, profiling
from gufo.kernels.positions import RowPositions
from gufo.models.base import PER_TOKEN_MAX_TOKENS
from gufo.models.kv_cache import CacheSnapshot, KVCache
from gufo.models.registry import PACKING_ARCHITECTURES, build_model
from gufo.options import DEFAULT_BATCH, DEFAULT_CONTEXT, POOLINGS, RunOptions
from gufo.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# told each generated token as it comes; returning True ends the generation after it (stopped_by "stop")
OnToken = Callable[[int], bool | None]


class PromptReuse(Protocol):
    """What a slot holds across generations, so a prompt is prefilled only past the prefix it can reuse
    (gufo.engine.prompt_cache.PromptCache)."""

    def prefill(self, slot: int, prompt: Sequence[int]) -> tuple[torch.Tensor, int]:
        """Prefill `prompt` on `slot` after the prefix it reuses: the last logits, the tokens reused."""
        ...

    def fed(self, slot: int, tokens: Sequence[int]) -> None:
        """Decode steps ran `tokens` on the slot."""
        ...

    def truncate(self, slot: int, length: int, keep_pages: bool = True) -> None:
        """The slot holds only its first `length` tokens (`keep_pages` False: its state is unknown)."""
        ...


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    generated_ids: list[int] = field(default_factory=list)
    prompt_seconds: float = 0.0
    generation_seconds: float = 0.0
    stopped_by: str = "length"  # "eog", "stop" (on_token asked) or "length"
    cached_tokens: int = 0  # prompt tokens the slot held already (`PromptReuse`), not prefilled again

    @property
    def prompt_tps(self) -> float:
        """Prompt tokens prefilled per second (cached ones cost nothing and are not counted)."""
        evaluated = len(self.prompt_ids) - self.cached_tokens
        return evaluated / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generation_tps(self) -> float:
        # The first generated token comes from the prefill's logits; the rest each cost one decode step.
        steps = max(len(self.generated_ids) - 1, 0)
        return steps / self.generation_seconds if self.generation_seconds else 0.0


class HiddenRows:
    """Per slot, the last layer's output rows ([n_embd], before the output norm) of the passes run on
    it, by position, for a proposer that reads the model's hidden state (multi-token prediction). A pass
    overwrites the rows from its first position on; the reader drops those it no longer needs."""

    def __init__(self, width: int, device: str | torch.device = "cpu") -> None:
        self.width, self.device = width, device
        self._start: dict[int, int] = {}  # slot -> the position of its first kept row
        self._rows: dict[int, torch.Tensor] = {}  # slot -> [kept rows, n_embd]

    def record(self, slot: int, start: int, rows: torch.Tensor) -> None:
        kept, first = self._rows.get(slot), self._start.get(slot, 0)
        if kept is not None and first <= start <= first + kept.shape[0]:
            rows, start = torch.cat([kept[: start - first], rows]), first
        self._start[slot], self._rows[slot] = start, rows

    def take(self, slot: int, begin: int, end: int) -> torch.Tensor:
        """The rows of positions begin..end - 1 [end - begin, n_embd], zeros where no pass on the slot
        left one (a position before the sequence: -1); the rows before `end` are dropped."""
        kept = self._rows.get(slot, torch.zeros(0, self.width, device=self.device))
        first = self._start.get(slot, begin)
        out = kept.new_zeros(end - begin, self.width)
        lo, hi = max(begin, first), min(end, first + kept.shape[0])
        if lo < hi:
            out[lo - begin : hi - begin] = kept[lo - first : hi - first]
        keep_from = max(end, first)
        self._rows[slot], self._start[slot] = kept[keep_from - first :], keep_from
        return out


def concrete_prefill_products(options: RunOptions, model_file: ModelFile) -> RunOptions:
    """`options` with KernelOptions.prefill_products "auto" made "tiles" for an architecture whose prompts
    can share prefill passes (PACKING_ARCHITECTURES: what the tiles are for), else "cublas" (the fastest
    for one prompt)."""
    kernels = options.kernels
    if kernels.prefill_products != "auto":
        return options
    products = "tiles" if model_file.architecture in PACKING_ARCHITECTURES else "cublas"
    return replace(options, kernels=replace(kernels, prefill_products=products))


# Most chunks one packed prefill pass takes: their last rows go through the output product together, which
# gives each row its one-row numbers up to this many rows (the skinny products' limit)
PACKED_MAX_PARTS = PER_TOKEN_MAX_TOKENS


@dataclass(frozen=True)
class PrefillPart:
    """One sequence's prefill chunk: `tokens` at positions `start`.. of `slot` (`Engine.prefill_parts`)."""

    slot: int
    start: int
    tokens: Sequence[int]


class Engine:
    """One process's model on one device. `gufo.parallel.ShardedEngine` runs a rank of a
    tensor-parallel launch by overriding the steps that touch the model (`forward`, `decode_step`,
    `snapshot`, `restore`, `copy_prefix`, `release_pages`, `set_threads`, `rank_peak_memory`) and the
    two switches below."""

    tensor_parallel = 1  # processes the model is sharded over
    # whether `decode_tokens` may replay one multi-token graph, and `decode_batch` run rows of several
    # slots in one pass (a sharded engine's followers mirror plain steps only)
    multi_token_graphs = True
    batched_rows = True

    def __init__(
        self,
        model: str | Path | None = None,
        options: RunOptions | None = None,
        context: int | None = None,
        n_slots: int = 1,
        batch_size: int = DEFAULT_BATCH,
        progress: LoadProgress | None = None,
        kv_memory: int | None = None,
    ):
        """`progress` hears how many tensor bytes the model has read while it loads. `kv_memory`: bytes
        of the KV cache's pages (`default_kv_memory` when None)."""
        options = options or RunOptions()
        self.path, self.file = open_checked(model, options.mmap)
        self.options = options = concrete_prefill_products(options, self.file)
        self.device = self._device(options.device)
        self.backend = backends.select(self.device, options.kernels)
        if options.threads:
            torch.set_num_threads(options.threads)
        self.tokenizer = Tokenizer.from_gguf(self.file.metadata)
        with profiling.ranges(options.profile):  # the kernels the model resolves, its decode route's too
            self.model, self.load_seconds = load_model(self.file, self.backend, self._build, progress)
            route = self.model.decode_route
        cfg = self.model.config
        self.context = min(context or DEFAULT_CONTEXT, cfg.context_length)
        if batch_size <= 0:
            raise BadInputError(f"--batch-size must be positive, got {batch_size}")
        self.batch_size = batch_size
        # several tokens per graph step where the decode route is batch-invariant (speculative drafts,
        # a server's rows); graphs past EXACT_ROWS rows are bucketed, their padding rows on a scratch slot
        graphs = options.graphs and self.backend == "cuda" and self.model.graph_capturable
        limit = (route.max_tokens or 1) if route.batch_invariant and self.multi_token_graphs else 1
        prefill_graphs = graphs and self.multi_token_graphs and options.profile is None
        # and the padding rows of packed prefill passes (`prefill_parts`): where prefill replays graphs
        # and every product keeps each row's numbers at any row count (gufo's fixed tiles; cuBLAS picks
        # kernels by the shape: docs/decisions.md, "Packed prefill")
        packs = prefill_graphs and self.batched_rows and self.model.packs_rows()
        scratch = graphs and self.batched_rows and (limit > EXACT_ROWS or packs)
        layout = {"scratch": True} if scratch else {}
        if kv_memory is None:
            kv_memory = default_kv_memory(self.device)
        self.cache: KVCache = self.model.new_cache(n_slots, self.context, memory=kv_memory, **layout)
        cache = self.cache
        log.debug(
            "KV cache: %d pages of %d positions, %.2f GiB (%d sessions x %d tokens need %d)",
            cache.total_pages,
            cache.page_size,
            cache.total_pages * cache.page_bytes / 2**30,
            n_slots,
            self.context,
            n_slots * cache.pages_per_slot,
        )
        # per slot, the recurrent state after each token but the last of the latest `decode_tokens`, in
        # buffers reused from call to call (fresh copies pay page faults each time), and how many are valid
        self._checkpoints: dict[int, list[list[torch.Tensor]]] = {}
        self._checkpointed: dict[int, int] = {}
        # GPU decode steps replay captured graphs unless `graphs` is off (eager op-by-op, for debugging)
        self.graph_decoder = None
        if graphs:
            from gufo.engine.graphs.decode import GraphDecoder

            device = backends.device_of(self.backend)
            # profiling: a graph's step runs uncaptured, so that each of its kernel calls is in its range
            capture = options.profile is None
            self.graph_decoder = GraphDecoder(self.model, self.cache, device, limit, capture)
        # prefill chunks replay piecewise graphs around the attention, one set per bucket of chunk lengths
        # (gufo.engine.graphs.chunks; eager prefill runs the same kernels: profiling takes that)
        self.prefill_graphs = None
        if self.graph_decoder is not None and prefill_graphs:
            from gufo.engine.graphs.prefill import PrefillGraphs

            if PrefillGraphs.supports(self.model):
                self.prefill_graphs = PrefillGraphs(self.model, self.cache, self.graph_decoder.device)
        # whether chunks of several sequences may share a prefill pass (`packs_prefill`)
        self.packed_prefill = packs and self.prefill_graphs is not None
        # whether every chunk runs as such a pass, its attention chunk-invariant (`chunk_invariant_prefill`)
        self.tiled_prefill = self.packed_prefill and self.model.chunk_invariant_attention()
        # the hidden rows of every pass, kept once a proposer asks for them (`keep_hidden_rows`)
        self.hidden_rows: HiddenRows | None = None

    def _device(self, device: str) -> str:
        """The device this process runs on (a tensor-parallel rank picks its own)."""
        return device

    def _build(self, model_file: ModelFile, backend: str) -> Any:
        """The model (a tensor-parallel rank builds its shard)."""
        return build_model(model_file, backend)

    def release_graphs(self) -> None:
        """Free the captured decode graphs. Needed before NCCL communicators are destroyed: a graph
        holding a collective makes ncclCommDestroy wait forever (pytorch/pytorch#115388)."""
        if self.graph_decoder is not None:
            self.graph_decoder.release()
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()

    def add_prefill_tap(self, layer: int, tap: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Apply `tap` to layer `layer`'s output on prefill passes (a debug perturbation). Prefill then
        runs the model's own layers eagerly: a captured chunk would not run the host-side tap, and the
        decode route (`invariant_prefill`) has no prefill pass to perturb; nor do chunks share passes."""
        self.model.prefill_taps[layer] = tap
        self.packed_prefill = self.tiled_prefill = False
        if self.prefill_graphs is not None:
            self.prefill_graphs.release()
            self.prefill_graphs = None
            log.info("prefill graphs off: a prefill tap is set on layer %d", layer)

    @property
    def config(self):
        return self.model.config

    def synchronize(self) -> None:
        """Wait for queued device work, so host timers measure finished steps."""
        if torch.device(self.device).type != "cpu":
            torch.accelerator.synchronize(torch.device(self.device))

    def check_fits(self, n_tokens: int) -> None:
        if n_tokens > self.context:
            raise BadInputError(f"prompt of {n_tokens} tokens does not fit the context size {self.context}")

    @property
    def invariant_prefill(self) -> bool:
        """Whether prefill runs through the batch-invariant decode route, which takes any number of tokens
        (the CPU's fused decode layer, qwen35's token-by-token layers): then a token's logits and KV
        depend only on the tokens up to it, never on how its prompt was chunked, which prefix was cached
        or which rows shared a pass, and equal a one-token decode step's (docs/decisions.md, "CPU prefill
        runs the fused decode layer", "CPU prefill of the hybrid runs token by token")."""
        route = self.model.decode_route
        return route.batch_invariant and route.max_tokens is None and not self.model.prefill_taps

    @property
    def chunk_invariant_prefill(self) -> bool:
        """Whether a prefilled token's logits and KV depend only on the tokens up to it, never on how its
        prompt was chunked, which prefix was cached or which rows shared its pass: through the decode
        route (`invariant_prefill`, whose numbers are a decode step's too), or on the GPU where every
        chunk runs on the fixed tiles (`tiled_prefill`: the tile products, which keep a row's numbers at
        any row count, in passes of at least PACK_MIN_ROWS rows, with an attention that cuts every row's
        keys at the same absolute positions; docs/decisions.md, "Chunk-invariant GPU prefill"), whose
        numbers are not a decode step's: there a decoded token's KV differs from a prefilled one's."""
        return self.invariant_prefill or self.tiled_prefill

    @torch.inference_mode()
    def prefill(
        self, tokens: Sequence[int], slot: int = 0, start: int = 0, all_logits: bool = False
    ) -> torch.Tensor:
        """Run tokens through the model in chunks of `batch_size`; logits of the last (or every) token.
        Through the decode route where that is batch-invariant (`invariant_prefill`), else the model's
        prefill layers (captured as graphs on GPUs)."""
        self.check_fits(start + len(tokens))
        if not tokens:
            raise BadInputError("empty prompt: nothing to evaluate")
        with profiling.phase_range(self.options.profile, profiling.PREFILL_RANGE):
            return self._prefill(tokens, slot, start, all_logits)

    def _prefill(self, tokens: Sequence[int], slot: int, start: int, all_logits: bool) -> torch.Tensor:
        ids = torch.tensor(list(tokens), dtype=torch.long)
        per_token = self.invariant_prefill
        outputs = []
        for begin in range(0, len(tokens), self.batch_size):
            chunk = ids[begin : begin + self.batch_size]
            is_last = begin + self.batch_size >= len(tokens)
            hidden = self._graph_hidden(chunk, slot, start + begin)
            if hidden is not None:
                logits = self.model.head(hidden, all_logits)
            else:
                logits = self.forward(chunk, slot, start + begin, all_logits=all_logits, per_token=per_token)
            if all_logits or is_last:
                outputs.append(logits)
        return (torch.cat(outputs) if all_logits else outputs[-1][-1]).cpu()

    def _graph_hidden(self, chunk: torch.Tensor, slot: int, start: int) -> torch.Tensor | None:
        """A chunk's residual stream through the prefill graphs (a view of their buffer; its rows kept
        where a proposer asks), or None where it runs eagerly: on the tiles (`tiled_prefill`) a packed
        pass of its own, else its bucket's graphs where their padding stays within the context."""
        if self.tiled_prefill:
            return self._packed_hidden([PrefillPart(slot, start, chunk.tolist())])
        size = self._replay_size(len(chunk), start)
        if size is None:
            return None
        hidden = self.prefill_graphs.hidden(chunk, slot, start, size)
        if self.hidden_rows is not None:  # the graphs' buffer is reused: a copy
            self.hidden_rows.record(slot, start, hidden.clone())
        return hidden

    def _replay_size(self, n_tokens: int, start: int) -> int | None:
        """The prefill graphs' length that a chunk of `n_tokens` at `start` replays, None where it runs
        eagerly (no prefill graphs, or its padding would run past the context)."""
        if self.prefill_graphs is None:
            return None
        return replay_size(n_tokens, start, self.batch_size, self.cache.context)

    @torch.inference_mode()
    def prepare_prefill(self, max_tokens: int, packed_tokens: int = 0) -> None:
        """Capture now the prefill graphs that chunks of up to `max_tokens` tokens replay (a server's
        --prefill-chunk), one set per bucket, and those of packed passes of up to `packed_tokens` rows
        (`prefill_parts`; a server's --prefill-batch), so that the first prompts do not pay for captures
        (logged with the time taken). At load only: the warm-ups write slot 0's first KV entries."""
        if self.tiled_prefill:  # every chunk a pass on the tiles
            self.prefill_graphs.prepare(pack_sizes(1, max(max_tokens, packed_tokens)))
        elif self.prefill_graphs is not None:
            sizes = prepared_sizes(max_tokens, self.batch_size, self.cache.context)
            if self.packed_prefill and packed_tokens > 2 * PACKED_MIN_TOKENS:
                sizes = tuple(sorted({*sizes, *pack_sizes(2 * PACKED_MIN_TOKENS + 2, packed_tokens)}))
            self.prefill_graphs.prepare(sizes)

    def packs_prefill(self, n_tokens: int) -> bool:
        """Whether a chunk of `n_tokens` tokens may share a prefill pass with other sequences' chunks
        (`prefill_parts`) with its numbers unchanged: where prefill replays graphs (plain attention and
        dense FFNs on a GPU), every product keeps each row's numbers at any row count (`DecoderModel.
        packs_rows`: gufo's fixed tiles, `--prefill-products tiles`; cuBLAS does not, measured) and the
        chunk is long enough that alone it takes the prefill route in every product, as every chunk does
        on the tiles (`tiled_prefill`) (the determinism contract; checked on the GPU by tests/models/
        test_device_engine.py)."""
        return self.packed_prefill and (self.tiled_prefill or n_tokens > PACKED_MIN_TOKENS)

    @torch.inference_mode()
    def prefill_parts(self, parts: Sequence[PrefillPart]) -> list[torch.Tensor]:
        """`prefill` of several sequences' chunks: each part's last token's logits [vocab] on the host,
        in order. The parts that `packs_prefill` run in passes of up to PACKED_MAX_PARTS of them (one graph
        replay of their rows, each part's attention over its own slot), the others one after another.
        Either way each part's numbers are those `prefill` gives it alone."""
        packable = [i for i, part in enumerate(parts) if self.packs_prefill(len(part.tokens))]
        logits: list[torch.Tensor | None] = [None] * len(parts)
        for first in range(0, len(packable), PACKED_MAX_PARTS):
            group = packable[first : first + PACKED_MAX_PARTS]
            if len(group) == 1:
                break  # a last one on its own runs alone, below
            for index, row in zip(group, self._packed_pass([parts[i] for i in group]), strict=True):
                logits[index] = row
        for index, part in enumerate(parts):
            if logits[index] is None:
                logits[index] = self.prefill(part.tokens, part.slot, part.start)
        return logits

    def _packed_pass(self, parts: Sequence[PrefillPart]) -> list[torch.Tensor]:
        """One graph replay of the parts' rows (`_packed_hidden`): each part's last logits."""
        with profiling.phase_range(self.options.profile, profiling.PREFILL_RANGE):
            hidden = self._packed_hidden(parts)
            last = hidden[[end - 1 for end in accumulate(len(part.tokens) for part in parts)]]
            return list(self.model.head(last, all_logits=True).cpu())

    def _packed_hidden(self, parts: Sequence[PrefillPart]) -> torch.Tensor:
        """The residual stream of the parts' rows, one part after another, from one graph replay
        (`PrefillGraphs.hidden_parts`, a view of its buffer) of `pack_bucket` rows."""
        from gufo.engine.graphs.prefill import Segment

        segments, row = [], 0
        for part in parts:
            self.check_fits(part.start + len(part.tokens))
            self.cache.reserve(part.slot, part.start, part.start + len(part.tokens))
            segments.append(Segment(part.slot, part.start, len(part.tokens), row))
            row += len(part.tokens)
        ids = torch.tensor([token for part in parts for token in part.tokens], dtype=torch.long)
        hidden = self.prefill_graphs.hidden_parts(segments, ids, pack_bucket(row))
        if self.hidden_rows is not None:  # the graphs' buffer is reused: copies
            for seg in segments:
                self.hidden_rows.record(seg.slot, seg.start, hidden[seg.row : seg.row + seg.n_tokens].clone())
        return hidden

    @torch.inference_mode()
    def embed(self, tokens: Sequence[int], pooling: str = "mean") -> torch.Tensor:
        """The output norm's values [n_embd] (float32, on the CPU) for `tokens`, pooled over them: their
        "mean", or the "last" token's. Runs in a scratch cache of its own, so no slot's KV changes."""
        self.check_fits(len(tokens))
        if not tokens:
            raise BadInputError("empty input: nothing to embed")
        if pooling not in POOLINGS:
            raise BadInputError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        scratch = self.model.new_cache(1, len(tokens))
        ids = torch.tensor(list(tokens), dtype=torch.long)
        total = None
        for begin in range(0, len(tokens), self.batch_size):
            hidden = self.model.final_hidden(ids[begin : begin + self.batch_size], scratch, 0, begin)
            normed = self.model.output_norm(hidden).float()
            total = normed.sum(0) if total is None else total + normed.sum(0)
        pooled = normed[-1] if pooling == "last" else total / len(tokens)
        return pooled.cpu()

    @torch.inference_mode()
    def decode(self, token: int, position: int, slot: int = 0) -> torch.Tensor:
        self.check_fits(position + 1)
        with profiling.phase_range(self.options.profile, profiling.DECODE_RANGE):
            return self.decode_step(token, position, slot).cpu()

    def forward(
        self, tokens: torch.Tensor, slot: int, start: int, all_logits: bool = False, per_token: bool = False
    ) -> torch.Tensor:
        """One model pass (the only entry to the model besides `decode_step`)."""
        return self._eager_pass(tokens, slot, start, all_logits, per_token)

    def _eager_pass(
        self, tokens: torch.Tensor, slot: int, start: int, all_logits: bool = False, per_token: bool = False
    ) -> torch.Tensor:
        """Logits of one eager model pass, its hidden rows kept where a proposer asked for them."""
        if self.hidden_rows is None:
            return self.model.forward(
                tokens, self.cache, slot, start, all_logits=all_logits, per_token=per_token
            )
        hidden = self.model.final_hidden(tokens, self.cache, slot, start, per_token)
        self.hidden_rows.record(slot, start, hidden)
        return self.model.head(hidden, all_logits)

    def keep_hidden_rows(self) -> HiddenRows:
        """Keep the hidden rows of every pass from now on (`HiddenRows`): eager passes and prefill graphs
        hand them out, the decode graphs from then on too (`GraphDecoder.keep_hidden`: captured again,
        so plain decoding's graphs write no more than their logits). Tensor parallelism refuses it (a
        rank holds a shard of the passes only)."""
        if self.tensor_parallel > 1:
            raise BadInputError("the model's hidden state is not kept under tensor parallelism")
        if self.hidden_rows is None:
            self.hidden_rows = HiddenRows(self.config.n_embd, self.model.device)
            if self.graph_decoder is not None:
                self.graph_decoder.keep_hidden()
        return self.hidden_rows

    def decode_step(self, token: int | torch.Tensor, position: int, slot: int) -> torch.Tensor:
        """Logits (on the device) of one token (an int, or a one-id tensor on the engine's device): a
        captured-graph replay on a GPU, else one eager pass."""
        queued = isinstance(token, torch.Tensor)
        if self.graph_decoder is not None:
            return self._graph_step(token.view(1) if queued else [token], position, slot)[-1]
        return self._eager_pass(token.view(1) if queued else torch.tensor([token]), slot, position)[-1]

    def _graph_step(
        self, tokens: Sequence[int] | torch.Tensor, position: int, slot: int, checkpoints: list | None = None
    ) -> torch.Tensor:
        """`GraphDecoder.decode`'s logits (its buffer), its hidden rows kept where a proposer asked."""
        logits = self.graph_decoder.decode(tokens, position, slot, checkpoints)
        if self.hidden_rows is not None:  # the graph's buffer is reused: a copy
            self.hidden_rows.record(slot, position, self.graph_decoder.hidden.clone())
        return logits

    def snapshot(self, slot: int, length: int) -> CacheSnapshot:
        """`KVCache.snapshot`."""
        return self.cache.snapshot(slot, length)

    def restore(self, state: CacheSnapshot) -> None:
        self.cache.restore(state)

    @torch.inference_mode()
    def copy_prefix(
        self, source: int, target: int, length: int, state: list[torch.Tensor] | None = None
    ) -> None:
        """`KVCache.copy_prefix`: slot `target` then holds the KV of slot `source`'s first `length`
        positions, on the engine's device. A model with recurrent state (not `rewindable`) needs
        `state`, the source's `save_state` taken when it held exactly those tokens (`source` may be
        `target`: the slot goes back to that point)."""
        if not self.rewindable and state is None:
            raise BadInputError("a model with recurrent state copies a prefix only with its saved state")
        self.cache.copy_prefix(source, target, length, state)

    def release_pages(self, slot: int, length: int) -> None:
        """`KVCache.release`: the slot keeps the pages of its first `length` positions only."""
        self.cache.release(slot, length)

    def adopt_pages(self, slot: int, pages: Sequence[int]) -> None:
        """`KVCache.adopt`: the slot holds `pages` (a prefix store's) as its first, read-only."""
        self.cache.adopt(slot, pages)

    @torch.inference_mode()
    def save_state(self, slot: int, into: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Copies of the slot's recurrent state, the state after the tokens it has run (into `into`, an
        earlier result, when given): for `copy_prefix`. Only with recurrent state."""
        if self.cache.recurrent is None:
            raise BadInputError("a model without recurrent state has no state to save")
        return self.cache.recurrent.save(slot, into)

    def set_threads(self, count: int) -> None:
        torch.set_num_threads(count)

    def rank_peak_memory(self) -> list[int]:
        """Peak memory of each rank in rank order (one entry without tensor parallelism)."""
        return [peak_memory_bytes(self.device)]

    @property
    def batch_invariant_decode(self) -> bool:
        """Whether `decode_tokens` runs all tokens in one pass (else one decode step each)."""
        return self.model.decode_route.batch_invariant

    @torch.inference_mode()
    def decode_tokens(self, tokens: Sequence[int], position: int, slot: int = 0) -> torch.Tensor:
        """Logits [T, vocab] of consecutive tokens from `position`, each bit-identical to what `decode`
        gives for it: one pass reading the weights once when the decode kernel is batch-invariant, one
        decode step per token otherwise (a batched prefill would change near-tied greedy choices).
        They stay on the engine's device: greedy verification needs only each row's argmax there."""
        self.check_fits(position + len(tokens))
        with profiling.phase_range(self.options.profile, profiling.DECODE_RANGE):
            return self._decode_tokens(tokens, position, slot)

    def _decode_tokens(self, tokens: Sequence[int], position: int, slot: int) -> torch.Tensor:
        limit = self.model.decode_route.max_tokens or len(tokens)
        one_pass = self.batch_invariant_decode and 1 < len(tokens) <= limit
        if self.cache.recurrent is not None:
            return self._decode_recurrent(tokens, position, slot, one_pass)
        # a lone token (nothing drafted) is a plain decode step: a graph replay on GPUs
        if not one_pass:
            steps = (self.decode_step(t, position + i, slot).clone() for i, t in enumerate(tokens))
            return torch.stack(list(steps))
        if self.graph_decoder is not None and self.multi_token_graphs:
            return self._graph_step(tokens, position, slot).clone()  # the graph's buffer is reused
        ids = torch.tensor(list(tokens), dtype=torch.long)
        return self.forward(ids, slot, position, all_logits=True, per_token=True)

    def _decode_recurrent(
        self, tokens: Sequence[int], position: int, slot: int, one_pass: bool
    ) -> torch.Tensor:
        """`decode_tokens` with recurrent state, checkpointed after each token but the last for
        `keep_tokens`: in one batch-invariant pass whose layers step token by token (one graph replay on
        a GPU, the checkpoints copied inside it), else one decode step per token."""
        recurrent = self.cache.recurrent
        pool = self._checkpoint_pool(slot, len(tokens) - 1)
        self._checkpointed[slot] = 0  # until this pass has written the checkpoints
        graphed = self.graph_decoder is not None  # without multi-token graphs: one graph step per token
        if one_pass and graphed and self.multi_token_graphs:
            rows = self._graph_step(tokens, position, slot, pool).clone()  # the graph's buffer is reused
        elif one_pass and not graphed:
            recurrent.keep_steps(slot, pool[: len(tokens) - 1])
            try:
                ids = torch.tensor(list(tokens), dtype=torch.long)
                rows = self.forward(ids, slot, position, all_logits=True, per_token=True)
            finally:
                recurrent.keep_steps(slot, None)
        else:
            steps = []
            for i, t in enumerate(tokens):
                if i:
                    recurrent.save(slot, into=pool[i - 1])
                steps.append(self.decode_step(t, position + i, slot).clone())  # graphs reuse their buffer
            rows = torch.stack(steps)
        self._checkpointed[slot] = len(tokens) - 1
        return rows

    def _checkpoint_pool(self, slot: int, count: int) -> list[list[torch.Tensor]]:
        """The slot's checkpoint buffers, at least `count`; grown by appending, so a buffer stays the
        same tensors from pass to pass (a captured verification step writes into those it saw)."""
        pool = self._checkpoints.setdefault(slot, [])
        while len(pool) < count:
            pool.append(self.cache.recurrent.save(slot))  # values overwritten before any read
        return pool

    def prepare_verification(self, n_tokens: int, slot: int = 0) -> None:
        """Capture now the graphs that `decode_tokens` replays for up to `n_tokens` tokens on `slot` (one
        per count), so the first speculative steps do not pay for captures."""
        if self.graph_decoder is None or not self.multi_token_graphs:
            return
        if self.cache.recurrent is None:
            self.graph_decoder.prepare(slot, n_tokens)
        elif self.batch_invariant_decode:  # as `_decode_recurrent` replays them, checkpoints and all
            self.graph_decoder.prepare(slot, n_tokens, self._checkpoint_pool(slot, n_tokens - 1))

    @property
    def rewindable(self) -> bool:
        """Whether a slot can go back to any earlier position (KV only); recurrent state cannot."""
        return self.cache.recurrent is None

    def keep_tokens(self, slot: int, count: int) -> None:
        """Keep only the first `count` tokens of the last `decode_tokens` on `slot` (the rest were rejected
        drafts). KV entries need nothing: later positions are overwritten before any read. Recurrent state
        goes back to the checkpoint taken after the first `count` tokens (after all of them it is current)."""
        if 0 < count <= self._checkpointed.pop(slot, 0):
            self.cache.recurrent.load(slot, self._checkpoints[slot][count - 1])

    @property
    def graph_capture_seconds(self) -> float:
        captures = (self.graph_decoder, self.prefill_graphs)
        return sum(graphs.capture_seconds for graphs in captures if graphs is not None)

    @torch.inference_mode()
    def decode_batch(
        self, tokens: Sequence[int] | torch.Tensor, positions: Sequence[int], slots: Sequence[int]
    ) -> torch.Tensor:
        """One decode step for several sequences (token i at positions[i] in slots[i]): logits [B, vocab],
        a fresh tensor left on the engine's device, so that a server copies to the host only the rows
        it samples there (`gufo.engine.sampling.greedy_split`). `tokens` may be ids on the engine's
        device (the previous step's greedy picks, still being computed): nothing then waits for them
        on a GPU's graph replays, so the host can queue the step before it reads the previous one.

        Each row's logits equal what `decode` gives it alone (greedy output does not depend on the
        batch): one pass reading each weight once for all rows when the decode kernel takes rows of
        different slots (the fused CPU layer), graph replays of up to `max_tokens` rows each on a GPU
        whose decode route is batch-invariant (each row over its own slot's KV and recurrent state), one
        decode step per row otherwise."""
        self.check_fits(max(positions) + 1)
        batched = self.model.decode_route.multi_slot and len(tokens) > 1  # the route chunks long batches
        with profiling.phase_range(self.options.profile, profiling.DECODE_RANGE):
            if len(tokens) > 1 and self._graph_rows:
                limit = self.graph_decoder.max_tokens
                out = None
                for i in range(0, len(tokens), limit):  # copied out: the next replay reuses the buffer
                    rows = self.graph_decoder.decode_rows(
                        tokens[i : i + limit], positions[i : i + limit], slots[i : i + limit]
                    )
                    out = rows.new_empty(len(tokens), rows.shape[-1]) if out is None else out
                    out[i : i + len(rows)] = rows
                return out
            if not batched or not self.batched_rows:  # graphs reuse their buffer: each row is cloned
                steps = zip(tokens, positions, slots, strict=True)
                return torch.stack([self.decode_step(t, p, s).clone() for t, p, s in steps])
            ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens), dtype=torch.long)
            where = RowPositions(tuple(slots), tuple(positions))
            return self.model.forward(ids, self.cache, slots[0], where, all_logits=True, per_token=True)

    @property
    def _graph_rows(self) -> bool:
        """Whether graph replays take decode steps of several sequences (each row its one-token numbers)."""
        decoder = self.graph_decoder
        return self.batched_rows and decoder is not None and decoder.max_tokens > 1

    def prepare_rows(self, n_rows: int) -> None:
        """Capture now the graphs that `decode_batch` replays for up to `n_rows` sequences (a server's
        sessions), so the first batched steps do not pay for captures."""
        if self._graph_rows:
            self.graph_decoder.prepare_rows(n_rows)

    def start_generation(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        slot: int,
        constraint: TokenConstraint | None = None,
        prompt_cache: PromptReuse | None = None,
    ) -> tuple[GenerationResult, Sampler, torch.Tensor]:
        """Check the room, prefill the prompt (timed; after the prefix `prompt_cache` holds of it, when
        given): the result to fill, its sampler (masked by `constraint`, a grammar, when given), the
        logits."""
        result = GenerationResult(list(prompt_ids))
        self.check_fits(len(prompt_ids) + max(max_tokens - 1, 0))
        sampler = Sampler(params, constraint=constraint)
        started = time.perf_counter()
        if prompt_cache is None:
            logits = self.prefill(prompt_ids, slot)
        else:
            logits, result.cached_tokens = prompt_cache.prefill(slot, prompt_ids)
        result.prompt_seconds = time.perf_counter() - started
        return result, sampler, logits

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_tokens: int,
        params: SamplingParams,
        stop_at_eog: bool = True,
        on_token: OnToken | None = None,
        slot: int = 0,
        constraint: TokenConstraint | None = None,
        prompt_cache: PromptReuse | None = None,
    ) -> GenerationResult:
        """Sample up to `max_tokens` after the prompt, each passed to `on_token` as it comes; its true
        answer ends generation after that token (a reverse prompt, a user's Ctrl-C): the slot then holds
        the prompt and the tokens before the last, as after any other ending. `constraint`: a grammar
        the tokens keep to. `prompt_cache`: what the slot holds, kept up to date, so the prompt is
        prefilled only past the prefix it can reuse (`PromptReuse.prefill`)."""
        result, sampler, logits = self.start_generation(
            prompt_ids, max_tokens, params, slot, constraint, prompt_cache
        )
        history = list(prompt_ids)
        started = time.perf_counter()
        position = len(prompt_ids)
        try:
            for step in range(max_tokens):
                token = sampler(logits, history)
                result.generated_ids.append(token)
                history.append(token)
                if on_token is not None and on_token(token):
                    result.stopped_by = "stop"
                    break
                if stop_at_eog and token in self.tokenizer.eog_ids:
                    result.stopped_by = "eog"
                    break
                if step + 1 == max_tokens:
                    break
                logits = self.decode(token, position, slot)
                position += 1
                if prompt_cache is not None:
                    prompt_cache.fed(slot, [token])
        except BaseException:  # a step cut short leaves the slot's state unknown
            if prompt_cache is not None:
                prompt_cache.truncate(slot, 0, keep_pages=False)
            raise
        result.generation_seconds = time.perf_counter() - started
        return result

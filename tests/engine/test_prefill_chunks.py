"""The prefill graphs' chunk buckets (gufo.engine.graphs.chunks): which graphs a chunk of n tokens
replays, when it runs eagerly instead, which buckets a server captures at load; and, on the CPU with a
stand-in for the graphs, which chunks `Engine.prefill` hands them (sizes and starts written out)."""

from __future__ import annotations

from itertools import accumulate

import pytest
import torch

from gufo.engine.engine import Engine
from gufo.engine.graphs import chunks
from tests.engine.tiny_model import write_tiny_model


def test_buckets_are_powers_of_two_from_sixteen_then_the_batch():
    assert chunks.buckets(512) == (16, 32, 64, 128, 256, 512)
    assert chunks.buckets(2048) == (16, 32, 64, 128, 256, 512, 1024, 2048)
    assert chunks.buckets(100) == (16, 32, 64, 100)
    assert chunks.buckets(16) == (16,)
    assert chunks.buckets(10) == (10,)
    assert chunks.buckets(1) == (1,)


@pytest.mark.parametrize(("batch", "sizes"), [(512, (16, 32, 64, 128, 256, 512)), (100, (16, 32, 64, 100))])
def test_a_chunk_replays_the_smallest_bucket_that_holds_it(batch, sizes):
    for n in range(1, batch + 1):
        assert chunks.bucket(n, batch) == min(size for size in sizes if size >= n), n


@pytest.mark.parametrize(("n", "batch"), [(0, 512), (513, 512), (17, 16)])
def test_a_chunk_outside_the_batch_is_refused(n, batch):
    with pytest.raises(ValueError, match=f"prefill chunk of {n} tokens"):
        chunks.bucket(n, batch)


def test_a_chunk_whose_padding_passes_the_context_runs_eagerly():
    assert chunks.replay_size(200, 0, 512, 4096) == 256
    assert chunks.replay_size(200, 3840, 512, 4096) == 256  # its padding ends at the context's end
    assert chunks.replay_size(200, 3841, 512, 4096) is None
    assert chunks.replay_size(5, 4080, 512, 4096) == 16
    assert chunks.replay_size(5, 4081, 512, 4096) is None
    assert chunks.replay_size(512, 3584, 512, 4096) == 512


def test_a_server_captures_the_buckets_its_chunks_reach():
    assert chunks.prepared_sizes(512, 512, 4096) == (16, 32, 64, 128, 256, 512)
    assert chunks.prepared_sizes(512, 2048, 4096) == (16, 32, 64, 128, 256, 512)
    assert chunks.prepared_sizes(300, 2048, 4096) == (16, 32, 64, 128, 256, 512)
    assert chunks.prepared_sizes(4096, 100, 4096) == (16, 32, 64, 100)
    assert chunks.prepared_sizes(512, 512, 100) == (16, 32, 64)  # a bucket past the context never runs


class RecordedGraphs:
    """Stands in for `PrefillGraphs` on the CPU: records each chunk it is handed and runs it eagerly."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.calls = engine, []

    def hidden(self, tokens: torch.Tensor, slot: int, start: int, size: int) -> torch.Tensor:
        self.calls.append((len(tokens), start, size))
        return self.engine.model.final_hidden(tokens, self.engine.cache, slot, start)


def test_prefill_hands_every_chunk_that_fits_to_the_graphs_padded(tmp_path):
    path = write_tiny_model(tmp_path / "tiny.gguf")
    engine = Engine(path, context=64, batch_size=32)
    graphs = engine.prefill_graphs = RecordedGraphs(engine)
    prompt = [i % 31 + 1 for i in range(45)]  # ids of the 32-token vocabulary
    engine.prefill(prompt[:40], start=20)  # 32 at 20, then 8 at 52: its 16-bucket would pass 64
    assert graphs.calls == [(32, 20, 32)]
    graphs.calls.clear()
    engine.prefill(prompt, start=10)  # 32 at 10, then 13 at 42 padded to 16 (ends at 58)
    assert graphs.calls == [(32, 10, 32), (13, 42, 16)]
    graphs.calls.clear()
    engine.prefill([3])  # one token: the 16-row bucket
    assert graphs.calls == [(1, 0, 16)]


def test_prefill_without_graphs_needs_no_bucket(tmp_path):
    engine = Engine(write_tiny_model(tmp_path / "tiny.gguf"), context=64, batch_size=32)
    assert engine.prefill_graphs is None and engine._replay_size(13, 42) is None
    # the prefill layers' attention kernel, reported beside the other routes (the CPU's: the torch reference)
    assert engine.model.routes()["attention_prefill"] == "torch:torch-sdpa-masked"
    engine.prepare_prefill(512)  # nothing to capture on the CPU


def test_a_packed_pass_replays_a_power_of_two_past_the_skinny_rows():
    """At least PACK_MIN_ROWS rows (128: past the 64 rows the skinny products keep), so that every product
    of the pass takes the prefill route, however few tokens it holds."""
    assert chunks.PACK_MIN_ROWS == 128 > chunks.PACKED_MIN_TOKENS
    assert [chunks.pack_bucket(n) for n in (1, 64, 128, 129, 450, 2048, 2049)] == [
        128, 128, 128, 256, 512, 2048, 4096,
    ]  # fmt: skip
    assert chunks.pack_sizes(1, 2048) == (128, 256, 512, 1024, 2048)
    assert chunks.pack_sizes(130, 600) == (256, 512, 1024)
    with pytest.raises(ValueError, match="pass of 0 tokens"):
        chunks.pack_bucket(0)


class RecordedPasses:
    """Stands in for `PrefillGraphs` on the CPU: records each packed pass it is handed (its parts and
    rows) and runs the parts eagerly, each through the CPU's own prefill route (the fused layer, token
    by token)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.calls = engine, []

    def hidden_parts(self, parts, tokens: torch.Tensor, size: int) -> torch.Tensor:
        self.calls.append(([(p.slot, p.start, p.n_tokens, p.row) for p in parts], size))
        model, cache = self.engine.model, self.engine.cache
        rows = [
            model.final_hidden(tokens[p.row : p.row + p.n_tokens], cache, p.slot, p.start, True)
            for p in parts
        ]
        return torch.cat(rows)

    def release(self) -> None:
        pass


def test_on_the_tiles_every_chunk_is_a_pass_of_its_own_however_short(tmp_path):
    """`tiled_prefill` (chunk-invariant prefill on the GPU's fixed tiles): every chunk runs as a packed
    pass of at least 128 rows, its padding on the scratch slot, even where a bucket's padding would pass
    the context (no eager fallback: an eager chunk would take other products); chunks of any length
    pack; and the logits are the eager layers' (the stand-in runs them)."""
    path = write_tiny_model(tmp_path / "tiny.gguf")
    engine = Engine(path, context=64, batch_size=32)
    plain = engine.prefill([i % 31 + 1 for i in range(45)], start=10)
    engine.packed_prefill = engine.tiled_prefill = True
    graphs = engine.prefill_graphs = RecordedPasses(engine)
    prompt = [i % 31 + 1 for i in range(45)]
    assert torch.equal(engine.prefill(prompt, start=10), plain)
    assert graphs.calls == [([(0, 10, 32, 0)], 128), ([(0, 42, 13, 0)], 128)]
    graphs.calls.clear()
    engine.prefill(prompt[:8], start=56)  # 56 + 8 = 64: a 16-row bucket would pass the context
    assert graphs.calls == [([(0, 56, 8, 0)], 128)]
    assert engine.packs_prefill(1)


def test_on_the_tiles_chunks_of_any_length_share_passes_of_up_to_16(tmp_path):
    """`prefill_parts` on the tiles: every part packs, however short (1 and 5 tokens beside 70), 16 parts a
    pass at most, a 17th alone; each part's last logits those of a fresh engine's prefill of it (the
    CPU engine's own, checked against llama.cpp elsewhere; the stand-in passes run its layers)."""
    from gufo.engine.engine import PrefillPart

    path = write_tiny_model(tmp_path / "tiny.gguf")
    engine = Engine(path, context=128, n_slots=17, batch_size=128)
    engine.packed_prefill = engine.tiled_prefill = True
    graphs = engine.prefill_graphs = RecordedPasses(engine)
    lengths = [1, 5, 70, *[2] * 14]  # 17 parts
    parts = [
        PrefillPart(slot, 0, [(3 * slot + i) % 31 + 1 for i in range(n)]) for slot, n in enumerate(lengths)
    ]
    got = engine.prefill_parts(parts)
    rows = [0, *accumulate(lengths[:15])]
    assert graphs.calls == [
        ([(slot, 0, n, row) for slot, (n, row) in enumerate(zip(lengths[:16], rows, strict=True))], 128),
        ([(16, 0, 2, 0)], 128),
    ]
    for part, logits in zip(parts, got, strict=True):
        fresh = Engine(path, context=128, batch_size=128)
        assert torch.equal(logits, fresh.prefill(part.tokens)), part.slot


def test_a_prefill_tap_turns_the_tiles_off(tmp_path):
    """A prefill tap (`--validate-prefill`'s noise) needs the model's own layers run eagerly: on the tiles
    too, no chunk then goes to the graphs or shares a pass, and the tap is applied."""
    path = write_tiny_model(tmp_path / "tiny.gguf")
    engine = Engine(path, context=64, batch_size=32)
    engine.packed_prefill = engine.tiled_prefill = True
    graphs = engine.prefill_graphs = RecordedPasses(engine)
    prompt = [i % 31 + 1 for i in range(20)]
    plain = engine.prefill(prompt)
    engine.add_prefill_tap(0, lambda hidden: hidden * 2)
    assert engine.prefill_graphs is None and not engine.packs_prefill(100)
    assert not torch.equal(engine.prefill(prompt), plain)
    assert graphs.calls == [([(0, 0, 20, 0)], 128)]  # the call before the tap only

"""The row buckets of batched decode graphs (gufo.engine.graphs.rows): which graph a step of n rows
replays, what its padding rows are, and, on the torch reference backend uncaptured, that a padded step
gives each real row its own eager step's logits while the padding writes the scratch slot only."""

from __future__ import annotations

import pytest
import torch

from gufo.engine.graphs import rows
from gufo.engine.graphs.decode import GraphDecoder
from gufo.gguf.model_file import open_model_file
from gufo.kernels.kv_pages import TRASH_PAGE
from gufo.models.registry import build_model
from tests.engine.tiny_model import write_tiny_model

# the buckets the tensor-core rows' route captures, written out (issue 23)
WIDE = (*range(1, 17), 32, 48, 64)


def test_buckets_are_the_exact_counts_then_multiples_of_sixteen():
    assert rows.buckets(64) == WIDE
    assert rows.buckets(16) == tuple(range(1, 17))
    assert rows.buckets(3) == (1, 2, 3)
    assert rows.buckets(1) == (1,)


@pytest.mark.parametrize("max_rows", [1, 3, 16, 64])
def test_a_step_replays_the_smallest_bucket_that_holds_it(max_rows):
    for n in range(1, max_rows + 1):
        want = min(size for size in WIDE if size >= n) if max_rows == 64 else n
        assert rows.bucket(n, max_rows) == want, n


@pytest.mark.parametrize(("n", "max_rows"), [(0, 16), (17, 16), (65, 64)])
def test_a_step_outside_the_graphs_is_refused(n, max_rows):
    with pytest.raises(ValueError, match=f"{n} rows in one graph step"):
        rows.bucket(n, max_rows)


def test_padding_rows_go_to_the_scratch_slot_at_position_zero():
    tokens, positions, slots = rows.padded([5, 6], [10, 3], [1, 0], 4, scratch_slot=7)
    assert (tokens, positions, slots) == ([5, 6, 0, 0], [10, 3, 0, 0], [1, 0, 7, 7])
    assert rows.padded([5], [2], [3], 1, scratch_slot=None) == ([5], [2], [3])  # nothing to pad
    with pytest.raises(ValueError, match="scratch slot"):
        rows.padded([5], [2], [3], 2, scratch_slot=None)


def test_the_scratch_slot_is_past_the_sessions(tmp_path):
    model = build_model(open_model_file(write_tiny_model(tmp_path / "tiny.gguf")), "torch")
    cache = model.new_cache(3, 16, scratch=True)
    assert cache.n_slots == 3 and cache.scratch_slot == 3
    assert cache.table.shape[0] == 4 and cache.held[3] == []  # its writes go to the trash page
    assert model.new_cache(3, 16).scratch_slot is None


@torch.inference_mode()
def test_a_padded_step_leaves_the_sessions_as_their_own_steps(tmp_path):
    """18 sequences step in the 32-row bucket (14 padding rows): each row its own eager step's logits,
    each slot's KV entries the eager ones and nothing past them in its pages; the padding (the scratch
    slot, at position 0) wrote the trash page's first entry only."""
    model = build_model(open_model_file(write_tiny_model(tmp_path / "tiny.gguf")), "torch")
    n = 18
    eager_cache, rows_cache = model.new_cache(n, 32), model.new_cache(n, 32, scratch=True)
    prompts = {slot: [(3 * slot + j) % 29 + 1 for j in range(1 + slot % 4)] for slot in range(n)}
    for cache in (eager_cache, rows_cache):
        for slot, prompt in prompts.items():
            model.forward(torch.tensor(prompt), cache, slot, 0)
    steps = GraphDecoder(model, rows_cache, torch.device("cpu"), max_tokens=64, capture=False)
    order = [(5 * i) % n for i in range(n)]
    positions = [len(prompts[slot]) for slot in order]
    tokens = [(7 * slot) % 29 + 1 for slot in order]
    got = steps.decode_rows(tokens, positions, order)
    assert got.shape[0] == n
    for row, (token, position, slot) in enumerate(zip(tokens, positions, order, strict=True)):
        eager = model.forward(torch.tensor([token]), eager_cache, slot, position)[-1]
        torch.testing.assert_close(got[row], eager, rtol=1e-5, atol=1e-5)
    for layer, rows_keys in enumerate(rows_cache.keys):
        for slot, prompt in prompts.items():
            length = len(prompt) + 1
            got, _ = rows_cache.entries(layer, slot, rows_cache.page_size)
            torch.testing.assert_close(got[:, :length], eager_cache.entries(layer, slot, length)[0])
            assert not got[:, length:].any()
        assert rows_keys[:, TRASH_PAGE, 0].any() and not rows_keys[:, TRASH_PAGE, 1:].any()

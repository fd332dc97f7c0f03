"""The paged KV cache (`gufo.models.kv_cache`): pages follow use, a prefix is shared read-only, and
every slot's entries equal an independent oracle (each slot's entries kept in order, in plain tensors)
through any sequence of growth, truncation and prefix sharing."""

from __future__ import annotations

import random

import pytest
import torch

from gufo.errors import BadInputError
from gufo.kernels.kv_pages import TRASH_PAGE
from gufo.models.kv_cache import KVCache, KVMemoryError

HEADS, DIM = 2, 4


def cache_of(n_slots: int, context: int, page_size: int = 8, memory: int | None = None) -> KVCache:
    return KVCache(2, n_slots, HEADS, context, DIM, DIM, memory=memory, page_size=page_size)


def grow(cache: KVCache, slot: int, start: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """Write `count` random entries (the same into keys and values, both layers) at start..; returns
    them as [Hkv, count, D]."""
    entries = torch.randn(count, HEADS, DIM, generator=gen)
    cache.reserve(slot, start, start + count)
    for layer in range(2):
        cache.append(layer, slot, start, entries, entries)
    return entries.transpose(0, 1)


def test_pages_follow_use():
    cache = cache_of(3, 64)  # 8 pages of 8 positions per slot: 24 in the pool
    assert (cache.total_pages, cache.free_pages, cache.held[0]) == (24, 24, [])
    cache.reserve(0, 0, 20)
    assert len(cache.held[0]) == 3 and cache.free_pages == 21
    assert cache.table[0, :4].tolist() == [*cache.held[0], TRASH_PAGE]  # the kernels' view of it
    cache.release(0, 9)
    assert len(cache.held[0]) == 2 and cache.free_pages == 22
    cache.release(0)
    assert cache.held[0] == [] and cache.free_pages == 24 and bool((cache.table == TRASH_PAGE).all())


def test_kv_memory_sizes_the_pool():
    page_bytes = 2 * HEADS * 8 * (DIM + DIM) * 4  # two layers of float32 keys and values
    assert cache_of(4, 64, memory=11 * page_bytes + 5).total_pages == 11
    assert cache_of(4, 64, memory=10**9).total_pages == 32  # at most every slot's whole context
    with pytest.raises(BadInputError, match="holds less than one sequence of 64 tokens"):
        cache_of(4, 64, memory=7 * page_bytes)


def test_a_reservation_beyond_the_free_pages_takes_none():
    cache = cache_of(2, 64, memory=10 * cache_of(1, 8).page_bytes)
    cache.reserve(0, 0, 64)
    with pytest.raises(KVMemoryError, match="2 free pages, positions 0..23 need 3"):
        cache.reserve(1, 0, 24)
    assert cache.held[1] == [] and cache.free_pages == 2
    with pytest.raises(BadInputError, match="sequence of 65 tokens exceeds the context size 64"):
        cache.reserve(1, 60, 65)


def test_a_shared_prefix_is_read_only():
    """Slot 1 takes over 20 positions of slot 0: it shares the two full pages and copies the third; its
    writes after truncating into a shared page go to a copy of it, and slot 0 reads what it wrote."""
    gen = torch.Generator().manual_seed(0)
    cache = cache_of(2, 64)
    written = grow(cache, 0, 0, 30, gen)
    free = cache.free_pages
    cache.copy_prefix(0, 1, 20)
    assert cache.held[1][:2] == cache.held[0][:2] and cache.held[1][2] != cache.held[0][2]
    assert cache.free_pages == free - 1  # the partial page only
    torch.testing.assert_close(cache.entries(0, 1, 20)[0], written[:, :20], rtol=0, atol=0)
    cache.release(1, 12)
    changed = grow(cache, 1, 12, 10, gen)
    assert cache.held[1][0] == cache.held[0][0] and cache.held[1][1] != cache.held[0][1]  # copied on write
    torch.testing.assert_close(cache.entries(0, 0, 30)[1], written, rtol=0, atol=0)
    mine = torch.cat([written[:, :12], changed], dim=1)
    torch.testing.assert_close(cache.entries(1, 1, 22)[1], mine, rtol=0, atol=0)


def test_entries_are_views_where_pages_are_in_order():
    """A slot's pages at its own place in the pool read as a view (a write through it reaches the
    pool); pages out of order are gathered."""
    gen = torch.Generator().manual_seed(1)
    cache = cache_of(2, 64)
    grow(cache, 1, 0, 20, gen)
    keys, _ = cache.entries(0, 1, 20)
    assert keys.data_ptr() == cache.keys[0][:, cache.held[1][0]].data_ptr()
    cache.copy_prefix(1, 0, 16)
    grow(cache, 0, 16, 4, gen)
    assert cache.held[0] != list(
        range(cache.held[0][0], cache.held[0][0] + 3)
    )  # slot 1's pages, then its own
    torch.testing.assert_close(cache.entries(0, 0, 16)[0], cache.entries(0, 1, 16)[0], rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(4))
def test_random_growth_truncation_and_sharing_match_the_oracle(seed):
    """300 random steps over 4 slots in a pool smaller than 4 whole contexts: after each, every slot's
    entries equal the oracle's bit for bit, a reservation fails exactly when the pool lacks the pages
    (and then changes nothing), and the pages held, shared or not, plus the free ones are the pool."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    cache = cache_of(4, 64, memory=20 * cache_of(1, 8).page_bytes)
    oracle = [torch.zeros(HEADS, 0, DIM) for _ in range(4)]
    for _ in range(300):
        slot, op = rng.randrange(4), rng.random()
        length = oracle[slot].shape[1]
        if op < 0.5:
            count = rng.randint(1, min(20, 64 - length)) if length < 64 else 0
            if count == 0:
                continue
            if cache.pages_needed(slot, length, length + count) > cache.free_pages:
                with pytest.raises(KVMemoryError):
                    cache.reserve(slot, length, length + count)
                continue
            oracle[slot] = torch.cat([oracle[slot], grow(cache, slot, length, count, gen)], dim=1)
        elif op < 0.75:
            keep = rng.randint(0, length)
            cache.release(slot, keep)
            oracle[slot] = oracle[slot][:, :keep]
        else:
            source = rng.randrange(4)
            if source == slot or (cache.free_pages == 0 and oracle[source].shape[1] % 8):
                continue
            keep = rng.randint(0, oracle[source].shape[1])
            cache.copy_prefix(source, slot, keep)
            oracle[slot] = oracle[source][:, :keep].clone()
        for s in range(4):
            end = oracle[s].shape[1]
            for layer in range(2):
                keys, values = cache.entries(layer, s, end)
                assert torch.equal(keys, oracle[s]) and torch.equal(values, oracle[s]), (s, layer)
        held = {page for pages in cache.held for page in pages}
        assert len(held) + cache.free_pages == cache.total_pages and TRASH_PAGE not in held
        assert all(cache.refs[page] == sum(page in pages for pages in cache.held) for page in held)

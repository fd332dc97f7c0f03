"""The prefix store (`gufo.engine.prompt_cache.PrefixStore`) over a real paged KV cache: pages found by
the tokens up to their end, kept once per prefix, and given back least recently used first when a
reservation lacks free pages, never one a slot still holds."""

from __future__ import annotations

from gufo.engine.prompt_cache import PrefixStore
from gufo.models.kv_cache import KVCache


def test_pages_are_found_by_their_whole_prefix():
    cache = KVCache(1, 2, 1, 16, 1, 1, page_size=4)
    store = PrefixStore(cache)
    tokens = list(range(10, 22))
    cache.reserve(0, 0, 12)
    store.keep(tokens, cache.held[0][:3])
    assert store.match(tokens + [1]) == cache.held[0][:3]
    assert store.match(tokens[:7]) == cache.held[0][:1]  # whole pages only
    assert store.match([99] + tokens[1:]) == []  # the same later tokens after another first page
    store.keep(tokens, [7, 7, 7])  # already kept for these tokens: the kept pages stay
    assert store.match(tokens) == cache.held[0][:3] and store.reclaimable() == 0  # the slot holds them too


def test_a_reservation_that_lacks_pages_takes_the_least_recently_used():
    """Three kept pages only the store holds, `new`'s used last: a reservation one page short gives back
    `old`'s first page (then `old` matches nothing; its second page, unreachable now, goes later)."""
    cache = KVCache(1, 2, 1, 16, 1, 1, page_size=4)  # 8 pages
    store = PrefixStore(cache)
    old, new = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9]
    cache.reserve(0, 0, 8)
    store.keep(old, cache.held[0])
    cache.reserve(1, 0, 4)
    store.keep(new, cache.held[1])
    cache.release(0)
    cache.release(1)
    assert store.reclaimable() == 3 and cache.free_pages == 5
    kept = store.match(new)  # used after `old`'s pages
    cache.reserve(0, 0, 16)  # 4 pages of 5 free: none of the store's
    assert store.reclaimable() == 3 and cache.free_pages == 1
    cache.reserve(1, 0, 8)  # 2 pages of 1 free: the least recently used kept page goes
    assert store.match(new) == kept and store.match(old) == []
    assert cache.free_pages == 0 and store.reclaimable() == 2

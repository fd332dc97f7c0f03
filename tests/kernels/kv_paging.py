"""Paged KV pools for the kernel tests: slots' contiguous entries laid out in pages of a pool in a
shuffled order, so a kernel that ignored the page table (or read the trash page) would be caught."""

from __future__ import annotations

import torch

from gufo.kernels.kv_pages import TRASH_PAGE, KVPages

UNUSED = 3e4  # the trash page's and the padding's entries: counted anywhere, they swamp a result


def paged(keys: torch.Tensor, values: torch.Tensor, page_size: int, seed: int) -> KVPages:
    """keys/values [slots, Hkv, ctx, D] -> a pool holding each slot's positions 0..ctx - 1 (the last page
    padded with UNUSED) in pages whose order a seeded permutation picks; page 0 is the trash page."""
    n_slots, heads, context, _ = keys.shape
    per_slot = -(-context // page_size)
    order = torch.randperm(n_slots * per_slot, generator=torch.Generator().manual_seed(seed)) + 1
    table = order.view(n_slots, per_slot)
    pools = []
    for entries in (keys, values):
        pool = torch.full((heads, n_slots * per_slot + 1, page_size, entries.shape[-1]), UNUSED,
                          dtype=entries.dtype, device=entries.device)  # fmt: skip
        padded = torch.full((n_slots, heads, per_slot * page_size, entries.shape[-1]), UNUSED,
                            dtype=entries.dtype, device=entries.device)  # fmt: skip
        padded[:, :, :context] = entries
        pages = padded.view(n_slots, heads, per_slot, page_size, -1).transpose(0, 1)
        pool[:, table.flatten().to(entries.device)] = pages.reshape(heads, -1, page_size, entries.shape[-1])
        pools.append(pool)
    assert TRASH_PAGE not in table
    return KVPages(*pools, table.to(keys.device))

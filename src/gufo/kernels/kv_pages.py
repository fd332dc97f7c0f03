"""One layer's KV entries in fixed-size pages, as every attention kernel reads and writes them.

The entries of all sequences share one pool of pages per layer, keys [Hkv, pages, PAGE, Dk] and values
[Hkv, pages, PAGE, Dv]; a table (one row per slot, on the pool's device) names the page that holds each
slot's positions: position p of slot s sits at offset p % PAGE of page table[s, p // PAGE]. Pages a slot
does not hold name the trash page (`TRASH_PAGE`), which a write past a sequence's end (a captured graph's
padding rows or warm-up) may overwrite and no sequence reads. The torch forms here are the oracles of
the kernels' paged addressing (gufo.kernels.triton.attention, the CPU decode layer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gufo.kernels.staging import staged

TRASH_PAGE = 0  # page id that every position a slot holds no page for names
PAGE_TOKENS = 64  # the cache's positions per page: a whole number of the decode attention's key tiles


@dataclass(frozen=True)
class KVPages:
    keys: torch.Tensor  # [Hkv, pages, PAGE, Dk]
    values: torch.Tensor  # [Hkv, pages, PAGE, Dv]
    table: torch.Tensor  # [slots, pages per slot] int64, on the pool's device

    @property
    def page_size(self) -> int:
        return self.keys.shape[2]

    def launch_rows(
        self, index: torch.Tensor, slots: torch.Tensor | int
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(table, slots, table stride) as the paged kernels take them, token t's table row at table +
        slots[t] * stride: with one slot for every token, that slot's row and stride 0 (the slots
        pointer then reads any int64 entries: the positions)."""
        if isinstance(slots, torch.Tensor):
            return self.table, slots, self.table.stride(0)
        return self.table[slots], index, 0

    def write(self, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | int) -> None:
        """k [T, Hkv, Dk] and v [T, Hkv, Dv] at positions index ([T] int64) of slots slots[t] (or the one
        slot given), in the pool's dtype; pages and offsets are found on the device (no host
        synchronisation: a captured graph writes through it)."""
        page, offset = self.table[slots, index // self.page_size], index % self.page_size
        self.keys[:, page, offset] = k.transpose(0, 1).to(self.keys.dtype)
        self.values[:, page, offset] = v.transpose(0, 1).to(self.values.dtype)

    def entries(
        self, slot: int, end: int, pages: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot `slot`'s keys and values at positions 0..end - 1, [Hkv, end, D] each: a view into the pool
        where the slot's pages are consecutive in order (then writes through it land in the pool), else a
        gathered copy. `pages`: the slot's page ids where the caller keeps them on the host (else they
        are read from the table, a host synchronisation)."""
        n_pages = -(-end // self.page_size)
        pages = (self.table[slot, :n_pages].tolist() if pages is None else pages)[:n_pages]
        if n_pages == 0 or pages == list(range(pages[0], pages[0] + n_pages)):
            first = pages[0] if n_pages else 0
            keys, values = self.keys[:, first : first + n_pages], self.values[:, first : first + n_pages]
        else:
            # from pinned memory: a GPU's eager prefill attention must not wait for the work queued before
            ids = staged(pages, self.keys.device).to(self.keys.device, non_blocking=True)
            keys, values = self.keys[:, ids], self.values[:, ids]
        heads, width = self.keys.shape[0], n_pages * self.page_size
        return (
            keys.reshape(heads, width, self.keys.shape[-1])[:, :end],
            values.reshape(heads, width, self.values.shape[-1])[:, :end],
        )

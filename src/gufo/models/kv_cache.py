"""The KV cache: every sequence's entries in fixed-size pages of one pool per layer, a slot per sequence.

A slot holds the pages of its positions 0..length (a block table, `KVPages`), taken from the pool as the
sequence grows (`reserve`) and given back when it shrinks (`release`), so the pool can hold fewer
positions than slots x context and memory follows use (vLLM's paged KV cache). A slot can take over
another's prefix by sharing its full pages, read-only, and copying the partial last one (`copy_prefix`);
a page shared by several slots is copied before a slot writes into it (`reserve`), so no slot ever
changes another's entries. Hybrid models allocate KV only for their attention layers and keep the
recurrent layers' state beside it (`recurrent`, per slot), which snapshots copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gufo.errors import BadInputError, GufoError
from gufo.kernels.kv_pages import PAGE_TOKENS, TRASH_PAGE, KVPages
from gufo.kernels.staging import staged
from gufo.models.recurrent_state import RecurrentState


class KVMemoryError(GufoError):
    """The pool has fewer free pages than a step needs (a server admits a request only when the pages
    of its whole sequence are there, so its steps never meet this)."""


@dataclass
class CacheSnapshot:
    """Copies of one slot's first `length` positions in every layer (see `KVCache.snapshot`)."""

    slot: int
    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    recurrent: list[torch.Tensor] | None = None  # the slot's recurrent-layer state, if the model has one


class KVCache:
    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        n_kv_heads: int,
        context: int,
        key_dim: int,
        value_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        attention_layers: Sequence[int] | None = None,
        recurrent: RecurrentState | None = None,
        scratch: bool = False,
        memory: int | None = None,
        page_size: int = PAGE_TOKENS,
    ):
        """`attention_layers`: the layers that get KV entries (all when None); the others get none.
        `scratch`: one more slot past the n_slots (`scratch_slot`), for the padding rows of a graph
        replay of more rows than a step has (gufo.engine.graphs.rows); it holds no pages (its writes
        go to the trash page) and no sequence runs there. `memory`: bytes of the pool, as many pages
        as fit, at most every slot's whole context (the default), at least one sequence's context."""
        if scratch and recurrent is not None:
            raise ValueError("a scratch slot holds KV entries only, not recurrent state")
        self.context = context
        self.n_slots = n_slots
        self.scratch_slot = n_slots if scratch else None
        self.recurrent = recurrent
        self.page_size = page_size
        self.pages_per_slot = -(-context // page_size)
        kv_layers = n_layers if attention_layers is None else len(attention_layers)
        self.page_bytes = kv_layers * n_kv_heads * page_size * (key_dim + value_dim) * dtype.itemsize
        total = n_slots * self.pages_per_slot
        if memory is not None and self.page_bytes:
            total = min(total, memory // self.page_bytes)
        if total < self.pages_per_slot:
            raise BadInputError(
                f"a KV cache of {total} pages ({total * self.page_bytes / 2**20:.0f} MiB) holds less than "
                f"one sequence of {context} tokens (the context size): more KV memory or a smaller context"
            )
        allocated = [
            0 if attention_layers is not None and layer not in attention_layers else total + 1
            for layer in range(n_layers)
        ]
        self.keys = [
            torch.zeros(n_kv_heads, n, page_size, key_dim, dtype=dtype, device=device) for n in allocated
        ]
        self.values = [
            torch.zeros(n_kv_heads, n, page_size, value_dim, dtype=dtype, device=device) for n in allocated
        ]
        rows = n_slots + scratch
        self.table = torch.full((rows, self.pages_per_slot), TRASH_PAGE, dtype=torch.long, device=device)
        self.held: list[list[int]] = [[] for _ in range(rows)]  # per slot, its pages in position order
        self.refs = [0] * (total + 1)  # per page, how many slots hold it
        self.free = set(range(1, total + 1))
        self.total_pages = total
        # asked for at least n more free pages when a reservation lacks them (a prefix store that holds
        # pages no slot does: `gufo.engine.prompt_cache.PrefixStore`)
        self.reclaim: Callable[[int], None] | None = None

    @property
    def dtype(self) -> torch.dtype:
        """Element type of the keys and values."""
        return self.keys[0].dtype

    @property
    def free_pages(self) -> int:
        return len(self.free)

    def pages_of(self, length: int) -> int:
        """Pages that hold positions 0..length - 1."""
        return -(-length // self.page_size)

    def pages_needed(self, slot: int, start: int, end: int) -> int:
        """Free pages `reserve(slot, start, end)` would take: pages past those the slot holds, and copies
        of the shared pages it would write into."""
        held, first = self.held[slot], start // self.page_size
        shared = sum(self.refs[page] > 1 for page in held[first : self.pages_of(end)])
        return max(0, self.pages_of(end) - len(held)) + shared

    def reserve(self, slot: int, start: int, end: int) -> None:
        """Make slot `slot` hold pages for positions 0..end - 1, those it writes (start..end - 1) its own:
        every write of those positions must come after this. Raises KVMemoryError (holding nothing
        more) when the pool has too few free pages."""
        if end > self.context:
            raise BadInputError(f"sequence of {end} tokens exceeds the context size {self.context}")
        needed = self.pages_needed(slot, start, end)
        if needed == 0:
            return  # the common case: a step within pages the slot owns
        self._make_free(needed, f"positions {start}..{end - 1} need")
        held = self.held[slot]
        for i in range(start // self.page_size, min(len(held), self.pages_of(end))):
            if self.refs[held[i]] > 1:  # shared: this slot writes into a copy of its own
                copy = self._take(slot, i)
                self._copy_page(held[i], copy)
                self.refs[held[i]] -= 1
                held[i] = copy
        while len(held) < self.pages_of(end):
            held.append(self._take(slot, len(held)))
        self._write_table(slot)

    def reserve_rows(self, slots: Sequence[int], positions: Sequence[int]) -> None:
        """`reserve` for a step of one token per row: row i at positions[i] of slots[i]."""
        for slot, position in zip(slots, positions, strict=True):
            self.reserve(slot, position, position + 1)

    def _make_free(self, count: int, need: str) -> None:
        """At least `count` free pages, the reclaim hook asked for those missing; raises KVMemoryError
        when the pool has no more, its message "... free pages, {need} {count}"."""
        if count > len(self.free) and self.reclaim is not None:
            self.reclaim(count - len(self.free))
        if count > len(self.free):
            raise KVMemoryError(f"the KV cache has {len(self.free)} free pages, {need} {count}")

    def hold(self, page: int) -> None:
        """One more holder of `page` (a slot, a prefix store): it stays out of the pool."""
        self.refs[page] += 1

    def drop(self, page: int) -> None:
        """A holder (a slot, a prefix store) lets `page` go: free once no one holds it."""
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free.add(page)

    def adopt(self, slot: int, pages: Sequence[int]) -> None:
        """The slot holds `pages` (held elsewhere: a slot's, a store's) as its first pages, read-only,
        instead of its own (a write into one copies it first, `reserve`)."""
        self.release(slot)
        for page in pages:
            self.hold(page)
        self.held[slot] = list(pages)
        self._write_table(slot)

    def _take(self, slot: int, index: int) -> int:
        """A free page for the slot's index-th page: the one at the slot's own place in the pool when
        free (a slot whose pages are consecutive reads its entries as a view: `KVPages.entries`)."""
        home = 1 + slot * self.pages_per_slot + index
        page = home if home in self.free else min(self.free)
        self.free.remove(page)
        self.refs[page] = 1
        return page

    def _copy_page(self, source: int, target: int) -> None:
        for keys, values in zip(self.keys, self.values, strict=True):
            if keys.shape[1]:
                keys[:, target] = keys[:, source]
                values[:, target] = values[:, source]

    def _write_table(self, slot: int) -> None:
        held = self.held[slot]
        row = held + [TRASH_PAGE] * (self.pages_per_slot - len(held))
        # pinned: a server's queued decode step must not wait for the steps before it (`staged`)
        self.table[slot].copy_(staged(row, self.table.device), non_blocking=True)

    def release(self, slot: int, length: int = 0) -> None:
        """Keep the pages of the slot's positions 0..length - 1 only; the rest go back to the pool."""
        held = self.held[slot]
        keep = self.pages_of(length)
        if len(held) <= keep:
            return
        for page in held[keep:]:
            self.drop(page)
        del held[keep:]
        self._write_table(slot)

    def pages(self, layer: int) -> KVPages:
        """A layer's pool and the slots' table, as the attention kernels take them."""
        return KVPages(self.keys[layer], self.values[layer], self.table)

    def entries(self, layer: int, slot: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A layer's keys and values of the slot's positions 0..end - 1, [kv_heads, end, dim] each (none
        for a layer without KV entries)."""
        if not self.keys[layer].shape[1]:
            return self.keys[layer][:, :0, 0], self.values[layer][:, :0, 0]
        held = self.held[slot]
        if len(held) < self.pages_of(end):  # a warm-up's read past what the slot holds: the trash page
            held = held + [TRASH_PAGE] * (self.pages_of(end) - len(held))
        return self.pages(layer).entries(slot, end, held)

    def append(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v ([T, kv_heads, dim]) at positions start.. of the slot (reserved: `reserve`)."""
        end = start + k.shape[0]
        if end > len(self.held[slot]) * self.page_size:
            raise RuntimeError(f"positions up to {end - 1} of slot {slot} hold no pages: reserve them first")
        index = torch.arange(start, end, device=self.table.device)
        self.pages(layer).write(index, k, v, slot)

    def write(
        self, layer: int, slot: int, index: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        slots: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        """`append` at positions held on the device (index [T] int64, no bounds check on the host), so
        the write can be captured in a CUDA graph; with `slots` ([T] int64) token t goes into slot
        slots[t]. Positions a slot holds no page for go to the trash page."""
        self.pages(layer).write(index, k, v, slot if slots is None else slots)

    def snapshot(self, slot: int, length: int) -> CacheSnapshot:
        """Copy positions 0..length of `slot`, so they can be put back after other work used the slot."""
        entries = [self.entries(layer, slot, length) for layer in range(len(self.keys))]
        return CacheSnapshot(
            slot,
            length,
            [k.clone() for k, _ in entries],
            [v.clone() for _, v in entries],
            None if self.recurrent is None else self.recurrent.save(slot),
        )

    def restore(self, state: CacheSnapshot) -> None:
        """Put a snapshot back; positions past its length are stale and get overwritten before any read."""
        self.reserve(state.slot, 0, state.length)
        index = torch.arange(state.length, device=self.table.device)
        for layer, (k, v) in enumerate(zip(state.keys, state.values, strict=True)):
            if self.keys[layer].shape[1]:
                self.write(layer, state.slot, index, k.transpose(0, 1), v.transpose(0, 1))
        if state.recurrent is not None:
            self.recurrent.load(state.slot, state.recurrent)

    def copy_prefix(
        self, source: int, target: int, length: int, recurrent: Sequence[torch.Tensor] | None = None
    ) -> None:
        """Slot `target` takes over positions 0..length of slot `source`: it shares the source's full
        pages (no copy; a write into one copies it first, `reserve`) and gets a copy of the partial last
        page; nothing moves when they are the same slot. A recurrent state holds a whole sequence and
        cannot be cut at `length`: a cache with one takes `recurrent`, the source's state saved
        (`RecurrentState.save`) when it held exactly those `length` tokens, and loads it into `target`."""
        if (self.recurrent is None) != (recurrent is None):
            raise ValueError("a prefix of a cache with recurrent state is copied with its saved state, only")
        if source != target:
            full, partial = divmod(length, self.page_size)
            self.adopt(target, self.held[source][:full])
            if partial:
                self._make_free(1, "copying a prefix's partial last page needs")
                page = self._take(target, full)
                self._copy_page(self.held[source][full], page)
                self.held[target].append(page)
            self._write_table(target)
        if recurrent is not None:
            self.recurrent.load(target, recurrent)

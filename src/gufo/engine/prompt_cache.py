"""What each KV slot holds, and how much of a new prompt it can reuse with a fresh prefill's numbers.

A prompt's output depends on the prompt alone, never on what was cached. Where the engine's prefill is
batch-invariant (`Engine.invariant_prefill`: the CPU's fused layer, or the hybrid's token-by-token
layers) any cached prefix gives the numbers a fresh prefill would, decoded tokens included. Where it is
chunk-invariant only (`Engine.chunk_invariant_prefill`: the GPU's fixed tiles) a prompt reuses any prefix
of prefilled tokens, never decoded ones (a decode step's numbers are not prefill's). Elsewhere a token's
numbers depend on the prefill chunk it was in, so chunks start at multiples of `chunk` (absolute
positions) and a prompt reuses only KV that its own fresh prefill would compute in the same chunks: whole
chunks of prefilled tokens, never decoded ones (docs/decisions.md, "Greedy output is a function of the
request alone").

A recurrent state (the hybrid models' linear-attention layers) holds a whole sequence and cannot be cut
at a prefix. A slot continues the whole sequence it holds; beyond that, after each prefill chunk that
ends at a multiple of `chunk` (and, where prefill is batch-invariant, at the end of the prompt) the
slot's state is saved (`Engine.save_state`), up to `state_checkpoints` in all (the least recently saved
or resumed one goes first), and a prompt that shares a saved point's tokens resumes there, with that
state and the KV before it: the same numbers as its own fresh prefill, which runs the same chunks.

The server's scheduler keeps one of these over all its slots (and copies prefixes between them);
`gufo chat` keeps one for its conversation, so a turn prefills only what the last one did not hold.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from itertools import islice

import torch

from gufo.engine.engine import Engine, PrefillPart
from gufo.engine.speculative import common_prefix
from gufo.models.kv_cache import KVCache

log = logging.getLogger(__name__)


class PrefixStore:
    """Full KV pages of prompts kept after the slots that computed them let them go (vLLM's automatic
    prefix caching): each page is found by the tokens up to its end (a trie of pages: a page's key is
    its parent page's entry and its own tokens), shared read-only into the next sequence that starts
    with them, and given back to the pool least recently used first when a reservation lacks pages
    (`KVCache.reclaim`). Only pages holding the numbers a fresh prefill of their tokens would compute
    are kept (`PromptCache.reusable`'s rule)."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        # (parent entry, the page's tokens) -> (entry, page), least recently used first; entry 0: the root
        self.entries: OrderedDict[tuple[int, tuple[int, ...]], tuple[int, int]] = OrderedDict()
        self.next_entry = 1
        cache.reclaim = self.evict

    def keep(self, tokens: Sequence[int], pages: Sequence[int]) -> None:
        """Keep pages[i], which holds tokens[i * PAGE:(i + 1) * PAGE] after tokens[:i * PAGE], for each
        page given (a page already kept for the same tokens stays the one kept)."""
        size, parent = self.cache.page_size, 0
        for i, page in enumerate(pages):
            key = (parent, tuple(tokens[i * size : (i + 1) * size]))
            if key not in self.entries:
                self.cache.hold(page)
                self.entries[key] = (self.next_entry, page)
                self.next_entry += 1
            self.entries.move_to_end(key)
            parent = self.entries[key][0]

    def match(self, tokens: Sequence[int]) -> list[int]:
        """The kept pages of the longest run of whole pages `tokens` starts with, now the most recently
        used."""
        size, parent, pages = self.cache.page_size, 0, []
        for i in range(len(tokens) // size):
            key = (parent, tuple(tokens[i * size : (i + 1) * size]))
            if key not in self.entries:
                break
            self.entries.move_to_end(key)
            parent, page = self.entries[key]
            pages.append(page)
        return pages

    def reclaimable(self) -> int:
        """Pages that only this store holds: what `evict` can give back."""
        return sum(self.cache.refs[page] == 1 for _, page in self.entries.values())

    def evict(self, count: int) -> None:
        """Give back up to `count` pages that only this store holds, least recently used first (a page a
        slot holds too would free nothing; its entry stays)."""
        alone = (key for key, (_, page) in self.entries.items() if self.cache.refs[page] == 1)
        for key in list(islice(alone, count)):
            self.cache.drop(self.entries.pop(key)[1])


class PromptCache:  # a `gufo.engine.engine.PromptReuse`
    def __init__(self, engine: Engine, chunk: int, state_checkpoints: int | None = None):
        """`chunk`: the prefill chunk every prompt is run in (a server's --prefill-chunk).
        `state_checkpoints`: with recurrent state, how many saved states the slots keep in all (0: none;
        None: one per slot)."""
        self.engine = engine
        self.chunk = chunk
        n_slots = engine.cache.n_slots
        self.tokens: list[list[int]] = [[] for _ in range(n_slots)]  # per slot, the ids whose KV is valid
        self.prefilled = [0] * n_slots  # per slot, how many of those came from prefill passes
        self.state_checkpoints = 0 if engine.rewindable else state_checkpoints
        if self.state_checkpoints is None:
            self.state_checkpoints = n_slots
        # (slot, L) -> the slot's state after its first L tokens, least recently saved or resumed first
        self.saved: OrderedDict[tuple[int, int], list[torch.Tensor]] = OrderedDict()
        # pages the slots let go, for the prompts after them: KV-only caches of one process (a recurrent
        # state cannot be cut at a page; tensor-parallel ranks would have to mirror the store)
        self.store = PrefixStore(engine.cache) if engine.rewindable and engine.tensor_parallel == 1 else None

    def reusable(self, slot: int, prompt: Sequence[int]) -> int:
        """How many of `prompt`'s first tokens the KV of `slot` holds as the prompt's own fresh prefill
        would compute them: any cached prefix where prefill is batch-invariant, any prefix of prefilled
        tokens where it is chunk-invariant, else whole chunks of prefilled tokens only; never the last
        token, whose logits give the first."""
        reused = min(common_prefix(self.tokens[slot], prompt), len(prompt) - 1, self.fresh(slot))
        return self._whole(reused)

    def _grain(self) -> int:
        """The lengths reuse takes: any where prefill is chunk-invariant, else multiples of `chunk` (a
        token's numbers depend on the chunk it was prefilled in)."""
        return 1 if self.engine.chunk_invariant_prefill else self.chunk

    def _whole(self, length: int) -> int:
        """`length` cut down to what reuse takes (`_grain`)."""
        return length // self._grain() * self._grain()

    def chunk_adds(self, slot: int, chunk: Sequence[int], prompt: Sequence[int], holds: int) -> bool:
        """Whether `slot`'s prefill of `chunk` (after what it holds) would let it hand `prompt` more than
        both `holds` tokens and what it can hand over now, as `reusable` reuses them (any prefix where
        prefill is batch-invariant, prefilled tokens only where it is chunk-invariant, else whole chunks
        of prefilled tokens; never the prompt's last token), by a whole `chunk` where chunks share prefill
        passes (waiting for the chunk splits the pass: a chat template's few shared first tokens are not
        worth that). With recurrent state what it can hand over now does not count: the copy may need
        the state the chunk saves (`resumable`)."""
        now = max(holds, self.reusable(slot, prompt)) if self.engine.rewindable else holds
        step = self.chunk if self.engine.packs_prefill(len(chunk)) else self._grain()
        wanted = now // step * step + step  # the shortest prefix longer than `now` worth waiting for
        tokens = self.tokens[slot]
        fresh_after = len(tokens) + len(chunk)
        if not self.engine.invariant_prefill:
            fresh_after = self._whole(self.prefilled[slot] + len(chunk))
        if wanted > min(fresh_after, len(prompt) - 1):
            return False  # the chunk does not get the slot there
        have = min(len(tokens), wanted)
        return tokens[:have] == prompt[:have] and list(chunk[: wanted - have]) == list(prompt[have:wanted])

    def fresh(self, slot: int) -> int:
        """How many of the slot's first tokens hold the numbers a fresh prefill of them would compute:
        all where prefill is batch-invariant, else its prefilled tokens (in whole chunks where prefill is
        not chunk-invariant either)."""
        if self.engine.invariant_prefill:
            return len(self.tokens[slot])
        return self._whole(self.prefilled[slot])

    def resumable(self, slot: int, prompt: Sequence[int]) -> int:
        """How many of `prompt`'s first tokens `slot` can go on after: `reusable` where the cache is KV
        only; with recurrent state the whole sequence the slot holds, or its longest saved state within
        the reusable prefix (0: none)."""
        reused = self.reusable(slot, prompt)
        if self.engine.rewindable or reused == len(self.tokens[slot]):
            return reused
        return max((at for s, at in self.saved if s == slot and at <= reused), default=0)

    def copy_source(self, slot: int, prompt: Sequence[int]) -> tuple[int, int | None]:
        """(length, source): the longest prefix of `prompt` that a slot other than `slot` can hand over
        (`Engine.copy_prefix`): a reusable prefix where the cache is KV only, else one the source saved
        its state after ((0, None): none)."""
        others = [s for s in range(len(self.tokens)) if s != slot]
        reusable = {s: self.reusable(s, prompt) for s in others}
        if self.engine.rewindable:
            return max(((length, s) for s, length in reusable.items()), default=(0, None))
        return max(((at, s) for s, at in self.saved if s != slot and at <= reusable[s]), default=(0, None))

    def stored(self, prompt: Sequence[int]) -> tuple[int, list[int]]:
        """(length, pages): the longest prefix of `prompt` the store holds, as `reusable` would reuse it
        (never the last token; whole chunks where prefill is not chunk-invariant), and its pages ((0, [])
        without a store)."""
        if self.store is None:
            return 0, []
        pages = self.store.match(prompt[: len(prompt) - 1])
        length = self._whole(len(pages) * self.engine.cache.page_size)
        return length, pages[: self.engine.cache.pages_of(length)]

    @property
    def stored_pages(self) -> int:
        """KV pages the prefix store keeps (0 without one)."""
        return 0 if self.store is None else len(self.store.entries)

    def reclaimable(self) -> int:
        """KV pages only the prefix store holds (0 without one): free for the asking."""
        return 0 if self.store is None else self.store.reclaimable()

    def adopt(self, slot: int, prompt: Sequence[int], length: int, pages: Sequence[int]) -> None:
        """`slot` now holds the first `length` tokens of `prompt` in `pages`, the store's (`stored`)."""
        self.truncate(slot, 0)
        self.engine.adopt_pages(slot, pages)
        self.tokens[slot] = list(prompt[:length])
        self.prefilled[slot] = length

    def resumed(self, slot: int, length: int) -> list[torch.Tensor]:
        """The state `slot` saved after its first `length` tokens, now the most recently used."""
        self.saved.move_to_end((slot, length))
        return self.saved[slot, length]

    def take(self, slot: int, length: int) -> None:
        """Start a prompt on `slot` after its first `length` cached tokens (`resumable`): keep those and
        the states saved within them, and load the slot's state saved at `length` where the slot held
        more (the engine may raise; the slot then holds nothing)."""
        resume = not self.engine.rewindable and 0 < length < len(self.tokens[slot])
        self.truncate(slot, length)
        if resume:
            try:
                self.engine.copy_prefix(slot, slot, length, self.resumed(slot, length))
            except Exception:
                self.truncate(slot, 0, keep_pages=False)
                raise

    def truncate(self, slot: int, length: int, keep_pages: bool = True) -> None:
        """Keep the slot's first `length` cached tokens, their KV pages, and its states saved within them;
        with `keep_pages` (not after a failure) the store keeps the whole pages of reusable tokens first."""
        if keep_pages and self.store is not None:
            pages = self.fresh(slot) // self.engine.cache.page_size
            self.store.keep(self.tokens[slot], self.engine.cache.held[slot][:pages])
        self.engine.release_pages(slot, length)
        del self.tokens[slot][length:]
        self.prefilled[slot] = min(self.prefilled[slot], length)
        for key in [(s, at) for s, at in self.saved if s == slot and at > length]:
            del self.saved[key]

    def copied(self, source: int, target: int, tokens: Sequence[int]) -> None:
        """`target` now holds `tokens`, a prefix copied from `source` (`Engine.copy_prefix`)."""
        self.tokens[target] = list(tokens)
        self.prefilled[target] = min(len(tokens), self.prefilled[source])

    def next_chunk(self, prompt: Sequence[int], position: int) -> Sequence[int]:
        """The prompt's tokens from `position` up to the next multiple of `chunk`: the chunks every
        prompt is prefilled in, with or without a cached prefix, however many prompts share a step."""
        return prompt[position : (position // self.chunk + 1) * self.chunk]

    def prefill_chunk(self, slot: int, chunk: Sequence[int], start: int, prompt_ends: bool) -> torch.Tensor:
        """Prefill `chunk` (`next_chunk`) at `start` of `slot`, after what it holds (its prompt's last
        when `prompt_ends`): the last token's logits. The slot's state is saved at a multiple of `chunk`
        and, where prefill is batch-invariant, at a prompt's end."""
        return self.prefill_chunks([PrefillPart(slot, start, chunk)], [prompt_ends])[0]

    def prefill_chunks(self, parts: Sequence[PrefillPart], prompt_ends: Sequence[bool]) -> list[torch.Tensor]:
        """`prefill_chunk` of several slots' chunks (one part per slot), through `Engine.prefill_parts`,
        which runs those it can in one pass: each part's last token's logits, in order."""
        logits = self.engine.prefill_parts(parts)
        for part, ends in zip(parts, prompt_ends, strict=True):
            slot = part.slot
            self.tokens[slot].extend(part.tokens)
            length = self.prefilled[slot] = len(self.tokens[slot])
            at_end = ends and self.engine.invariant_prefill
            if self.state_checkpoints and (length % self.chunk == 0 or at_end):
                self.save_state(slot, length)
        return logits

    def fed(self, slot: int, tokens: Sequence[int]) -> None:
        """Decode steps ran `tokens` on the slot after what it held."""
        self.tokens[slot].extend(tokens)

    def save_state(self, slot: int, length: int) -> None:
        """Keep the slot's state after its first `length` tokens, in the buffers of the least recently
        used saved state when `state_checkpoints` are kept already."""
        if (slot, length) in self.saved:
            self.saved.move_to_end((slot, length))
            return
        into = None
        if len(self.saved) >= self.state_checkpoints:
            into = self.saved.popitem(last=False)[1]
        try:
            self.saved[slot, length] = self.engine.save_state(slot, into)
        except torch.OutOfMemoryError:  # a saved state is an optimisation: keep those that fit
            self.state_checkpoints = len(self.saved)
            log.warning("out of memory for saved states: keeping %d", self.state_checkpoints)

    def prefill(self, slot: int, prompt: Sequence[int]) -> tuple[torch.Tensor, int]:
        """Prefill `prompt` on `slot` after the longest prefix the slot can go on after, in chunks that
        start at multiples of `chunk`: the last token's logits and how many tokens were reused."""
        reused = self.resumable(slot, prompt)
        stored, pages = self.stored(prompt)
        if stored > reused:
            self.adopt(slot, prompt, stored, pages)
            reused = stored
        else:
            self.take(slot, reused)
        position = reused
        try:
            while position < len(prompt):
                chunk = self.next_chunk(prompt, position)
                logits = self.prefill_chunk(slot, chunk, position, position + len(chunk) == len(prompt))
                position += len(chunk)
        except BaseException:  # a chunk cut short leaves the slot's state unknown
            self.truncate(slot, 0, keep_pages=False)
            raise
        return logits, reused

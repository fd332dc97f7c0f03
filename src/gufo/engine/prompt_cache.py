"""What each KV slot holds, and how much of a new prompt it can reuse with a fresh prefill's numbers.

A prompt's output depends on the prompt alone, never on what was cached. Where the engine's prefill is
batch-invariant (`Engine.invariant_prefill`: the CPU's fused layer, or the hybrid's token-by-token
layers) any cached prefix gives the numbers a fresh prefill would, decoded tokens included. Elsewhere a
token's numbers depend on the prefill chunk it was in, so chunks start at multiples of `chunk` (absolute
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

import torch

from gufo.engine.engine import Engine
from gufo.engine.speculative import common_prefix

log = logging.getLogger(__name__)


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

    def reusable(self, slot: int, prompt: Sequence[int]) -> int:
        """How many of `prompt`'s first tokens the KV of `slot` holds as the prompt's own fresh prefill
        would compute them: any cached prefix where prefill is batch-invariant, else whole chunks of
        prefilled tokens only; never the last token, whose logits give the first."""
        reused = min(common_prefix(self.tokens[slot], prompt), len(prompt) - 1)
        if not self.engine.invariant_prefill:
            reused = min(reused, self.prefilled[slot]) // self.chunk * self.chunk
        return reused

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
                self.truncate(slot, 0)
                raise

    def truncate(self, slot: int, length: int) -> None:
        """Keep the slot's first `length` cached tokens, their KV pages, and its states saved within them."""
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
        logits = self.engine.prefill(chunk, slot, start=start)
        self.tokens[slot].extend(chunk)
        length = self.prefilled[slot] = len(self.tokens[slot])
        at_end = prompt_ends and self.engine.invariant_prefill
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
        self.take(slot, reused)
        position = reused
        try:
            while position < len(prompt):
                chunk = self.next_chunk(prompt, position)
                logits = self.prefill_chunk(slot, chunk, position, position + len(chunk) == len(prompt))
                position += len(chunk)
        except BaseException:  # a chunk cut short leaves the slot's state unknown
            self.truncate(slot, 0)
            raise
        return logits, reused

"""A draft proposer for rollback tests: the plain continuation with one token corrupted per step."""

from __future__ import annotations

from collections.abc import Sequence

from gufo.runtime.sampling import Sampler
from gufo.runtime.speculative import Draft


class ScriptedProposer:
    """Drafts the known plain continuation but corrupts token j of step s's draft, j = s mod
    (draft_max + 1): over the steps, rejection at every draft position and full acceptance."""

    def __init__(self, prompt_len: int, plain_ids: list[int], draft_max: int):
        self.prompt_len, self.plain, self.draft_max, self.step = prompt_len, plain_ids, draft_max, 0

    def propose(self, history: Sequence[int], limit: int, sampler: Sampler) -> Draft:
        done = len(history) - self.prompt_len
        tokens = self.plain[done : done + min(limit, self.draft_max)]
        reject_at = self.step % (self.draft_max + 1)
        self.step += 1
        if reject_at < len(tokens):
            tokens[reject_at] = (tokens[reject_at] + 1) % 32
        return Draft(tokens)

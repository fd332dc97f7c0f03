"""Rollback tests: a draft proposer that is rejected at every draft position over the steps, and the
check that such a run leaves the state a run that never drafted leaves."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gufo.engine.engine import Engine
from gufo.engine.sampling import Sampler, SamplingParams
from gufo.engine.speculative import Draft, Speculator


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


def check_rejections_leave_plain_state(
    engine: Engine,
    state: Callable[[Engine, int], list[torch.Tensor]],
    poison: Callable[[Engine], None],
    draft_max: int = 4,
) -> None:
    """Greedy speculation with drafts rejected at every position gives the plain tokens and leaves
    `state(engine, valid length)` equal, bit for bit, to the plain run's; `poison` wipes the state in
    between so that nothing of the plain run can survive."""
    greedy = SamplingParams(temperature=0.0)
    prompt, n = [1, 7, 9, 7, 9, 11, 13, 7, 9], 40
    plain = engine.generate(prompt, n, greedy, stop_at_eog=False)
    expected = state(engine, len(prompt) + n - 1)
    poison(engine)
    speculator = Speculator(engine, ScriptedProposer(len(prompt), plain.generated_ids, draft_max))
    result = speculator.generate(prompt, n, greedy, stop_at_eog=False)
    assert result.generated_ids == plain.generated_ids
    stats = speculator.stats
    assert stats.steps >= draft_max + 1 and 0 < stats.accepted < stats.drafted
    actual = state(engine, len(prompt) + n - 1)
    assert all(torch.equal(a, b) for a, b in zip(actual, expected, strict=True))

"""Token sampling: greedy (ties -> lowest id) or the llama.cpp chain
repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = torch.Generator()
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = ()) -> int:
        """Pick the next token from a 1-D float logit vector (on any device: greedy picks where the logits
        are, so only the id crosses to the host); `history` feeds the repeat penalty."""
        logits = self.penalized(logits, history)
        if self.params.greedy:
            return int(torch.argmax(logits))  # first maximum: ties go to the lowest id
        ids, final = self._candidates(logits.cpu())
        choice = torch.multinomial(final, 1, generator=self.generator)
        return int(ids[choice])

    def probabilities(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        """The whole distribution `__call__` draws from, over the vocabulary (float64; greedy: a point
        mass on the argmax). Speculative sampling compares target and draft through it."""
        logits = self.penalized(logits, history).cpu()
        dense = torch.zeros(logits.numel(), dtype=torch.float64)
        if self.params.greedy:
            dense[int(torch.argmax(logits))] = 1.0
            return dense
        ids, final = self._candidates(logits)
        dense[ids] = final.double()
        return dense / dense.sum()

    def penalized(self, logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        p = self.params
        logits = logits.float()
        if p.repeat_penalty != 1.0 and history and p.repeat_last_n != 0:
            recent = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
            ids = torch.tensor(sorted(set(recent)), dtype=torch.long, device=logits.device)
            picked = logits[ids]
            logits = logits.clone()
            logits[ids] = torch.where(picked > 0, picked / p.repeat_penalty, picked * p.repeat_penalty)
        return logits

    def _candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The surviving token ids and their final (tempered) probabilities."""
        p = self.params
        if 0 < p.top_k < logits.numel():
            candidates, ids = torch.topk(logits, p.top_k)  # sorted descending
        else:
            candidates, ids = torch.sort(logits, descending=True, stable=True)
        probs = torch.softmax(candidates, -1)
        if p.top_p < 1.0:
            cumulative = torch.cumsum(probs, -1)
            keep = int(torch.searchsorted(cumulative, torch.tensor([p.top_p])).item()) + 1
            candidates, ids, probs = candidates[:keep], ids[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep_mask = probs >= p.min_p * probs[0]
            candidates, ids = candidates[keep_mask], ids[keep_mask]
        return ids, torch.softmax(candidates / p.temperature, -1)

"""Token sampling: greedy (ties -> lowest id) or the llama.cpp chain
penalties -> top-k -> top-p -> min-p -> temperature -> draw.

Penalties: llama.cpp's repeat penalty over the last `repeat_last_n` tokens of the history, then
OpenAI's presence/frequency penalties over the generated tokens (the history after `prompt_length`)
and its logit bias. Finite-probability rule: the draw works in float64 on logits shifted by their
maximum, so any temperature > 0 gives finite probabilities (-inf logits get probability 0); a row
whose best penalized logit is not finite (NaN or +inf, from an extreme penalty or a broken forward
pass, or every logit -inf) has no distribution and is decoded greedily, NaN counting as -inf. One bad
row therefore never raises, and never touches another request's row.

A batch of rows (a server's decode step) is split first (`greedy_split`): the plainly greedy rows get
their tokens where the logits are, the others come to the host whole for their Samplers.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import torch

from gufo.engine.constraint import TokenConstraint
from gufo.engine.params import SamplingParams
from gufo.kernels.staging import staged


class Sampler:
    def __init__(
        self, params: SamplingParams, prompt_length: int = 0, constraint: TokenConstraint | None = None
    ):
        """`prompt_length`: how many leading history tokens are the prompt, which the presence and
        frequency penalties leave out (OpenAI counts only generated tokens); `constraint`: this
        request's grammar, which masks the penalized logits and hears every token drawn."""
        self.params = params
        self.prompt_length = prompt_length
        self.constraint = constraint
        self.generator = torch.Generator()
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        else:
            self.generator.seed()

    def __call__(self, logits: torch.Tensor, history: Sequence[int] = ()) -> int:
        """Pick the next token from a 1-D float logit vector (on any device: greedy picks where the logits
        are, so only the id crosses to the host); `history` feeds the penalties."""
        logits = self.penalized(logits, history)
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        drawn = None if self.params.greedy else self._candidates(logits.cpu())
        if drawn is None:
            token = int(first_max(logits))
        else:
            ids, final = drawn
            token = int(ids[torch.multinomial(final, 1, generator=self.generator)])
        self.accept(token)
        return token

    def probabilities(self, logits: torch.Tensor, history: Sequence[int] = ()) -> torch.Tensor:
        """The whole distribution `__call__` draws from, over the vocabulary (float64; greedy: a point
        mass on the argmax), masked by the constraint in its current state and renormalised.
        Speculative sampling compares target and draft through it, then `accept`s what it drew."""
        logits = self.penalized(logits, history)
        if self.constraint is not None:
            logits = self.constraint.mask(logits)
        logits = logits.cpu()
        dense = torch.zeros(logits.numel(), dtype=torch.float64)
        drawn = None if self.params.greedy else self._candidates(logits)
        if drawn is None:
            dense[int(first_max(logits))] = 1.0
            return dense
        ids, final = drawn
        dense[ids] = final
        return dense / dense.sum()

    @property
    def first_max_of_masked(self) -> bool:
        """Whether `__call__` is the first maximum of the logits masked by the constraint (if any)
        whatever the history: greedy, with no penalty or bias that changes the logits."""
        p = self.params
        unpenalized = (p.repeat_penalty == 1.0 or p.repeat_last_n == 0) and not (
            p.presence_penalty or p.frequency_penalty or p.logit_bias
        )
        return p.greedy and unpenalized

    @property
    def plain_greedy(self) -> bool:
        """Whether `__call__` is the raw logits' first maximum whatever the history: `first_max_of_masked`
        with no grammar that masks them (`greedy_split`)."""
        return self.first_max_of_masked and self.constraint is None

    def accept(self, token: int) -> None:
        """The constraint hears a token drawn from `probabilities` rather than by `__call__`."""
        if self.constraint is not None:
            self.constraint.accept(token)

    def penalized(self, logits: torch.Tensor, history: Sequence[int]) -> torch.Tensor:
        p = self.params
        logits = logits.float()
        if p.repeat_penalty != 1.0 and history and p.repeat_last_n != 0:
            recent = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
            ids = torch.tensor(sorted(set(recent)), dtype=torch.long, device=logits.device)
            picked = logits[ids]
            logits = logits.clone()
            logits[ids] = torch.where(picked > 0, picked / p.repeat_penalty, picked * p.repeat_penalty)
        generated = history[self.prompt_length :]
        if (p.presence_penalty or p.frequency_penalty) and generated:
            counts = Counter(generated)
            ids = torch.tensor(list(counts), dtype=torch.long, device=logits.device)
            times = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
            logits = logits.clone()
            logits[ids] -= times * p.frequency_penalty + p.presence_penalty
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), dtype=torch.long, device=logits.device)
            bias = torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype, device=logits.device)
            logits = logits.clone()
            logits[ids] += bias
        return logits

    def _candidates(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The surviving token ids and their final (tempered) float64 probabilities; None when the best
        logit is not finite (NaN sorts first), so there is no distribution to draw from."""
        p = self.params
        if 0 < p.top_k < logits.numel():
            candidates, ids = torch.topk(logits, p.top_k)  # sorted descending
        else:
            candidates, ids = torch.sort(logits, descending=True, stable=True)
        best = float(candidates[0])
        if not math.isfinite(best):
            return None
        candidates = candidates.double() - best  # the best is 0, the rest <= 0: no temperature overflows
        probs = torch.softmax(candidates, -1)
        if p.top_p < 1.0:
            cumulative = torch.cumsum(probs, -1)
            keep = int(torch.searchsorted(cumulative, torch.tensor([p.top_p], dtype=cumulative.dtype))) + 1
            candidates, ids, probs = candidates[:keep], ids[:keep], probs[:keep]
        if p.min_p > 0.0:
            keep_mask = probs >= p.min_p * probs[0]
            candidates, ids = candidates[keep_mask], ids[keep_mask]
        return ids, torch.softmax(candidates / p.temperature, -1)


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """The index of each row's first maximum (ties go to the lowest id), NaN counting as -inf (as the
    lowest float, like -inf). Without a NaN and with a maximum above the lowest float (every real row),
    the raw maximum is that index: no copy of the logits then (a fresh 39 MB one per 64-row step page
    faulted on the CPU). The check reads the maxima on the host (see `first_max_queued`)."""
    values, ids = torch.max(logits, dim=-1)  # NaN propagates: a row's NaN is its value
    if bool(_real_rows(logits, values).all()):
        return ids
    return _first_max_of_odd_rows(logits)


def first_max_queued(logits: torch.Tensor) -> torch.Tensor:
    """`first_max`, queued on the logits' device without waiting for it (the host reads nothing): every
    row's odd-row answer is computed too and the raw maximum kept where the row is real. On the CPU,
    where nothing is queued, `first_max` itself."""
    if logits.device.type == "cpu":
        return first_max(logits)
    values, ids = torch.max(logits, dim=-1)
    return torch.where(_real_rows(logits, values), ids, _first_max_of_odd_rows(logits))


def _real_rows(logits: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Rows whose raw maximum is their first maximum: no NaN, the maximum above the lowest float."""
    return values > torch.finfo(logits.dtype).min


def _first_max_of_odd_rows(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(torch.nan_to_num(logits, nan=float("-inf"), posinf=float("inf")), dim=-1)


class QueuedTokens:
    """Token ids computed on a device, the host's copy on its way: `ids` (on the device) can feed the next
    step at once, and `tolist` waits for these ids only, not for work queued after them."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self._ready: torch.cuda.Event | None = None
        if ids.device.type == "cpu":
            self._host = ids
            return
        self._host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
        self._host.copy_(ids, non_blocking=True)
        self._ready = torch.cuda.Event()  # torch.cuda drives HIP on ROCm too
        self._ready.record(torch.cuda.current_stream(ids.device))

    def tolist(self) -> list[int]:
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()

    def mixed(self, rows: Sequence[int | None], ids: Sequence[int]) -> torch.Tensor:
        """Ids on the device, one per entry: row `rows[i]` of these ids, or `ids[i]` where that is None;
        the given values travel from pinned memory, so the host waits for nothing."""
        values = [[r or 0 for r in rows], list(ids), [int(r is not None) for r in rows]]
        given = staged(values, self.ids.device).to(self.ids.device, non_blocking=True)
        return torch.where(given[2].bool(), self.ids[given[0]], given[1])


def greedy_split(
    logits: torch.Tensor, plain: Sequence[bool]
) -> tuple[list[int | None], list[torch.Tensor | None]]:
    """For logits [B, vocab] on any device: the greedy token of each `plain` row (`Sampler.plain_greedy`
    and no logprobs wanted), picked where the logits are in one pass, so only its id crosses to the host,
    and every other row whole on the host (one copy); None in the other list's place."""
    picked = [i for i, p in enumerate(plain) if p]
    rest = [i for i, p in enumerate(plain) if not p]
    tokens: list[int | None] = [None] * len(plain)
    rows: list[torch.Tensor | None] = [None] * len(plain)

    def gathered(indices: list[int]) -> torch.Tensor:  # the whole batch without a copy
        return logits if len(indices) == len(plain) else logits[torch.tensor(indices, device=logits.device)]

    if picked:
        for i, token in zip(picked, first_max(gathered(picked)).tolist(), strict=True):
            tokens[i] = token
    if rest:
        for i, row in zip(rest, gathered(rest).cpu(), strict=True):
            rows[i] = row
    return tokens, rows

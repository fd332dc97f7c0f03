"""`--validate-prefill N`: the decode path and the batched prefill path must agree on the same tokens.

N tokens go one at a time through decode, then the same N through one batched prefill (chunked by the
engine's batch size) from position 0; the final full-vocabulary logits are compared. Pass = both finite
and the same top-1 token. The report also gives the decode path's top-1 lead over its runner-up
(sequential_margin): a mismatch at a lead smaller than max_abs_diff is a near-tie that the two paths'
rounding swapped.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gufo.engine.engine import Engine
from gufo.errors import BadInputError
from gufo.tools.quality.logit_diff import LogitDiff, compare_logits

SEED = 4321


@dataclass(frozen=True)
class PrefillValidation:
    n_tokens: int
    diff: LogitDiff  # reference = sequential (decode path), candidate = batched prefill

    @property
    def passed(self) -> bool:
        return self.diff.finite and self.diff.top1_match

    def lines(self) -> list[str]:
        d = self.diff
        yes = {True: "yes", False: "no"}
        return [
            f"[Prefill Validation] tokens={self.n_tokens} sequential_top1={d.reference_top1} "
            f"batched_top1={d.candidate_top1} top1_match={yes[d.top1_match]} finite={yes[d.finite]}",
            f"[Prefill Validation] max_abs_diff={d.max_abs_diff:.8f} mean_abs_diff={d.mean_abs_diff:.8f} "
            f"rmse={d.rmse:.8f} cosine={d.cosine:.8f} sequential_margin={d.reference_margin:.8f}",
        ]

    def as_dict(self) -> dict[str, object]:
        return {"tokens": self.n_tokens, "passed": self.passed, **self.diff.as_dict()}


def validation_tokens(engine: Engine, count: int) -> list[int]:
    """Random ids from a fixed seed, BOS first when the model adds BOS."""
    rng = random.Random(SEED)
    tokens = [rng.randrange(engine.config.vocab_size) for _ in range(count)]
    if engine.tokenizer.add_bos and engine.tokenizer.bos_id is not None:
        tokens[0] = engine.tokenizer.bos_id
    return tokens


def decode_sequentially(engine: Engine, tokens: list[int]) -> torch.Tensor:
    """The decode path's logits after the last of `tokens`, fed one at a time from position 0."""
    logits = torch.empty(0)
    for position, token in enumerate(tokens):
        logits = engine.decode(token, position)
    return logits


def validate_prefill(
    engine: Engine, n_tokens: int, progress: Callable[[str], None] | None = None
) -> PrefillValidation:
    if n_tokens < 2:
        raise BadInputError(f"--validate-prefill needs at least 2 tokens, got {n_tokens}")
    engine.check_fits(n_tokens)
    tokens = validation_tokens(engine, n_tokens)
    report = progress or (lambda _message: None)
    report(f"prefill validation: {n_tokens} tokens one at a time")
    sequential = decode_sequentially(engine, tokens)
    report(f"prefill validation: {n_tokens} tokens batched")
    batched = engine.prefill(tokens)
    return PrefillValidation(n_tokens, compare_logits(sequential, batched))


def add_prefill_noise(engine: Engine, layer: int, std: float) -> None:
    """Debug hook: add Gaussian noise to one layer's output on multi-token (prefill) passes only.

    It exists so tests can prove that --validate-prefill fails when the batched path goes wrong.
    """
    n_layers = engine.model.config.n_layers
    if not 0 <= layer < n_layers:
        raise BadInputError(f"debug noise layer {layer} is outside 0..{n_layers - 1}")
    generator = torch.Generator().manual_seed(SEED)

    def noisy(out: torch.Tensor) -> torch.Tensor:
        return out + torch.randn(out.shape, generator=generator).to(out) * std

    engine.add_prefill_tap(layer, noisy)

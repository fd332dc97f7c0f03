"""The parameters of sampling and speculative decoding, without torch: the CLI reads their defaults
for --help and builds them from flags before the engine (and torch) is imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gufo.errors import BadInputError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> added to its logit
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


SPECULATIVE_MODES = ("ngram", "draft", "mtp")
# most tokens drafted per step unless --draft-max says: mtp takes llama.cpp's 3 (a multi-token-prediction
# block is trained one token ahead, so its later drafts are kept less and less often)
DRAFT_MAX = {"ngram": 8, "draft": 8, "mtp": 3}


@dataclass(frozen=True)
class SpeculativeParams:
    mode: str = "ngram"
    draft_max: int | None = None  # None: the mode's DRAFT_MAX
    draft_min: int = 1  # drafts shorter than this are not verified
    ngram_min: int = 2

    def __post_init__(self) -> None:
        if self.mode not in SPECULATIVE_MODES:
            known = ", ".join(SPECULATIVE_MODES)
            raise BadInputError(f"--speculative: unknown mode {self.mode!r} (known: {known})")
        if self.draft_max is None:
            object.__setattr__(self, "draft_max", DRAFT_MAX[self.mode])
        if self.draft_max < 1 or self.draft_min < 0 or self.ngram_min < 1:
            raise BadInputError("--draft-max and --ngram-min must be >= 1, --draft-min >= 0")
        if self.draft_min > self.draft_max:
            raise BadInputError(f"--draft-min {self.draft_min} exceeds --draft-max {self.draft_max}")

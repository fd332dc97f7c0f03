"""What one `gufo bench` test is (a pp/tg/depth triple, optionally speculative), apart from how it is
timed (gufo.tools.bench.runner), so that `gufo compare` reads runs without loading the engine."""

from __future__ import annotations

from dataclasses import dataclass

REPEAT_BLOCK, REPEATS = 32, 4  # the repetitive prompt of speculative tests: 32 random ids, 4 times


@dataclass(frozen=True)
class BenchTest:
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    speculative: str | None = None  # speculative mode of a generation test

    @property
    def name(self) -> str:
        parts = [f"pp{self.n_prompt}"] if self.n_prompt else []
        parts += [f"tg{self.n_gen}"] if self.n_gen else []
        mode = f"-{self.speculative}" if self.speculative else ""
        depth = f" @ d{self.n_depth}" if self.n_depth else ""
        return "+".join(parts) + mode + depth

    @property
    def n_tokens(self) -> int:
        if self.speculative:
            return REPEAT_BLOCK * REPEATS + self.n_gen
        return self.n_depth + self.n_prompt + self.n_gen

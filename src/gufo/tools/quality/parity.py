"""Greedy-faithfulness corpus: every prompt through plain decoding and through a speculative mode.

The token traces (SHA-256 of the generated ids) must be equal; the speeds and the acceptance show what
speculation buys. The default corpus ships with gufo: half repetitive prompts (code, lists, copies)
where prompt lookup drafts get accepted, half ordinary prompts.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gufo.engine.engine import Engine, GenerationResult
from gufo.engine.sampling import SamplingParams
from gufo.engine.speculative import SpeculativeStats, Speculator
from gufo.engine.trace import token_trace_hash
from gufo.errors import BadInputError

DEFAULT_CORPUS = Path(__file__).with_name("parity_corpus.jsonl")
GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class ParityPrompt:
    id: str
    prompt: str
    repetitive: bool = False


def load_corpus(path: Path | None = None) -> list[ParityPrompt]:
    """JSONL, one object a line: {"id": str, "prompt": str, "repetitive": bool (optional)}."""
    path = path or DEFAULT_CORPUS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"--corpus {path}: cannot read: {err}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompts.append(ParityPrompt(str(item["id"]), str(item["prompt"]), bool(item.get("repetitive"))))
        except (ValueError, KeyError, TypeError):
            raise BadInputError(
                f"--corpus {path}: line {number}: expected a JSON object with string fields id and prompt"
            ) from None
    if not prompts:
        raise BadInputError(f"--corpus {path}: no prompts")
    return prompts


@dataclass(frozen=True)
class ParityResult:
    prompt: ParityPrompt
    plain: GenerationResult
    speculative: GenerationResult
    stats: SpeculativeStats

    @property
    def plain_hash(self) -> str:
        return token_trace_hash(self.plain.generated_ids)

    @property
    def speculative_hash(self) -> str:
        return token_trace_hash(self.speculative.generated_ids)

    @property
    def match(self) -> bool:
        return self.plain.generated_ids == self.speculative.generated_ids

    def line(self) -> str:
        return (
            f"[Parity] {self.prompt.id}: {'match' if self.match else 'MISMATCH'} "
            f"count={len(self.plain.generated_ids)}/{len(self.speculative.generated_ids)} "
            f"plain={self.plain_hash[:16]} speculative={self.speculative_hash[:16]} "
            f"plain_tps={self.plain.generation_tps:.2f} "
            f"speculative_tps={self.speculative.generation_tps:.2f} "
            f"acceptance={self.stats.accepted}/{self.stats.drafted}"
        )


@dataclass(frozen=True)
class ParitySummary:
    results: list[ParityResult]

    @property
    def mismatches(self) -> int:
        return sum(not r.match for r in self.results)

    @staticmethod
    def _rate(runs: list[GenerationResult]) -> float:
        seconds = sum(r.generation_seconds for r in runs)
        return sum(max(len(r.generated_ids) - 1, 0) for r in runs) / seconds if seconds else 0.0

    @property
    def plain_tps(self) -> float:
        return self._rate([r.plain for r in self.results])

    @property
    def speculative_tps(self) -> float:
        return self._rate([r.speculative for r in self.results])

    @property
    def stats(self) -> SpeculativeStats:
        total = SpeculativeStats()
        for r in self.results:
            total.add(r.stats)
        return total

    def line(self) -> str:
        speedup = self.speculative_tps / self.plain_tps if self.plain_tps else 0.0
        return (
            f"[Parity Summary] prompts={len(self.results)} mismatches={self.mismatches} "
            f"plain_tps={self.plain_tps:.2f} speculative_tps={self.speculative_tps:.2f} "
            f"speedup={speedup:.2f}x acceptance={self.stats.acceptance:.3f} "
            f"drafted={self.stats.drafted} accepted={self.stats.accepted} steps={self.stats.steps}"
        )


def run_parity(
    engine: Engine,
    speculator: Speculator,
    prompts: list[ParityPrompt],
    n_predict: int,
    stop_at_eog: bool = True,
    progress: Callable[[str], None] | None = None,
) -> Iterator[ParityResult]:
    """Greedy plain and speculative generation of each prompt, yielded as each finishes."""
    for index, item in enumerate(prompts, 1):
        if progress is not None:
            progress(f"prompt {index}/{len(prompts)} {item.id}")
        ids = engine.tokenizer.encode(item.prompt, add_special=True)
        plain = engine.generate(ids, n_predict, GREEDY, stop_at_eog=stop_at_eog)
        speculative = speculator.generate(ids, n_predict, GREEDY, stop_at_eog=stop_at_eog)
        yield ParityResult(item, plain, speculative, speculator.stats)

"""What `gufo bench` times, with llama-bench's semantics.

A prompt test times the prefill of n_prompt random token ids (BOS first when the model adds one) in
logical batches of n_batch; a generation test times n_gen single-token decode steps, synchronising the
device after each. The depth is prefilled untimed once per depth, snapshotted, and restored before the
warm-up and every repetition. Tokenization and sampling are never timed, except in speculative tests
(`tg128-ngram`): greedy generation with speculation after an untimed repetitive prompt (a random
block of ids repeated), timing the n_gen tokens that follow the prompt's own prediction.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gufo.engine.engine import Engine
from gufo.engine.sampling import SamplingParams
from gufo.engine.speculative import SpeculativeStats, Speculator
from gufo.models.kv_cache import CacheSnapshot
from gufo.tools.bench.workload import REPEAT_BLOCK, REPEATS, BenchTest

SEED = 1234  # fixed, so two builds time the same token ids
GREEDY = SamplingParams(temperature=0.0)


def with_speculative(tests: list[BenchTest], mode: str) -> list[BenchTest]:
    """A speculative twin after each generation-only test at depth 0."""
    out: list[BenchTest] = []
    for test in tests:
        out.append(test)
        if test.n_gen and not test.n_prompt and not test.n_depth:
            out.append(BenchTest(0, test.n_gen, 0, mode))
    return out


def plan_tests(
    prompts: list[int], gens: list[int], pairs: list[tuple[int, int]], depths: list[int]
) -> list[BenchTest]:
    """llama-bench's order: per depth, the prompt tests, then the generation tests, then the pairs."""
    tests: list[BenchTest] = []
    for depth in depths:
        tests += [BenchTest(n, 0, depth) for n in prompts if n > 0]
        tests += [BenchTest(0, n, depth) for n in gens if n > 0]
        tests += [BenchTest(p, g, depth) for p, g in pairs if p > 0 or g > 0]
    return tests


@dataclass
class Timing:
    """Nanoseconds per repetition, and the llama-bench statistics derived from them."""

    test: BenchTest
    samples_ns: list[int]
    speculative: SpeculativeStats | None = None  # summed over the timed repetitions
    test_time: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))

    @property
    def samples_ts(self) -> list[float]:
        tokens = self.test.n_prompt + self.test.n_gen
        return [tokens * 1e9 / ns for ns in self.samples_ns]

    @property
    def avg_ns(self) -> int:
        return round(statistics.fmean(self.samples_ns))

    @property
    def stddev_ns(self) -> int:
        return round(sample_stddev(self.samples_ns))

    @property
    def avg_ts(self) -> float:
        return statistics.fmean(self.samples_ts)

    @property
    def stddev_ts(self) -> float:
        return sample_stddev(self.samples_ts)


def sample_stddev(values: list[float] | list[int]) -> float:
    """Standard deviation with n - 1 in the denominator; 0 for a single value, as llama-bench."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


Progress = Callable[[str], None]
# a context around each timed repetition (test, repetition index), e.g. a profiler's range
AroundRepetition = Callable[[BenchTest, int], contextlib.AbstractContextManager]


class BenchRunner:
    """Times tests on one engine (slot 0); depth prefixes are prefilled once and reused."""

    def __init__(
        self,
        engine: Engine,
        repetitions: int,
        n_batch: int,
        warmup: bool = True,
        delay: float = 0.0,
        progress: Progress | None = None,
        speculator: Speculator | None = None,
        around_repetition: AroundRepetition | None = None,
    ):
        self.engine = engine
        self.repetitions = repetitions
        self.n_batch = n_batch
        self.warmup = warmup
        self.delay = delay
        self.progress = progress or (lambda _message: None)
        self.speculator = speculator
        self.around_repetition = around_repetition or (lambda _test, _rep: contextlib.nullcontext())
        self._depths: dict[int, CacheSnapshot] = {}
        self._random = random.Random(SEED)

    def run(self, tests: list[BenchTest]) -> Iterator[Timing]:
        """Yield each test's timing as soon as it is measured (the caller prints rows as they come)."""
        for index, test in enumerate(tests, 1):
            label = f"test {index}/{len(tests)} {test.name}"
            self.engine.check_fits(test.n_tokens)
            if self.warmup:
                self.progress(f"{label}: warm-up")
                self._restore_depth(test.n_depth)
                self._time_once(BenchTest(test.n_prompt, min(test.n_gen, 1), test.n_depth))
            samples = []
            stats = SpeculativeStats() if test.speculative else None
            for rep in range(self.repetitions):
                if self.delay:
                    time.sleep(self.delay)
                self.progress(f"{label}: repetition {rep + 1}/{self.repetitions}")
                self._restore_depth(test.n_depth)
                with self.around_repetition(test, rep):
                    samples.append(self._time_once(test))
                if stats is not None:
                    stats.add(self.speculator.stats)
            yield Timing(test, samples, stats)

    def _restore_depth(self, depth: int) -> None:
        if depth == 0:
            return
        if depth not in self._depths:
            self.progress(f"prefilling depth {depth} (untimed)")
            self._prefill(self._random_tokens(depth), 0)
            self.engine.synchronize()
            self._depths[depth] = self.engine.snapshot(0, depth)
        self.engine.restore(self._depths[depth])

    def _random_tokens(self, count: int) -> list[int]:
        """`count` random ids, the first one BOS when the model adds BOS (llama-bench's rule)."""
        vocab = self.engine.config.vocab_size
        tokens = [self._random.randrange(vocab) for _ in range(count)]
        bos = self.engine.tokenizer.bos_id
        if tokens and self.engine.tokenizer.add_bos and bos is not None:
            tokens[0] = bos
        return tokens

    def _prefill(self, tokens: list[int], start: int) -> None:
        for begin in range(0, len(tokens), self.n_batch):
            self.engine.prefill(tokens[begin : begin + self.n_batch], start=start + begin)

    def _time_once(self, test: BenchTest) -> int:
        if test.speculative:
            return self._time_speculative(test)
        prompt_tokens = self._random_tokens(test.n_prompt)
        gen_tokens = self._random_tokens(test.n_gen)
        position = test.n_depth + test.n_prompt
        self.engine.synchronize()
        started = time.perf_counter_ns()
        if prompt_tokens:
            self._prefill(prompt_tokens, test.n_depth)
            self.engine.synchronize()
        for offset, token in enumerate(gen_tokens):
            self.engine.decode(token, position + offset)
            self.engine.synchronize()
        return time.perf_counter_ns() - started

    def _time_speculative(self, test: BenchTest) -> int:
        if self.speculator is None:
            raise ValueError(f"{test.name}: the runner has no speculator")
        block = self._random_tokens(REPEAT_BLOCK)
        # n_gen + 1 tokens: the first comes from the (untimed) prompt's logits, like a tg test's input
        result = self.speculator.generate(block * REPEATS, test.n_gen + 1, GREEDY, stop_at_eog=False)
        return round(result.generation_seconds * 1e9)

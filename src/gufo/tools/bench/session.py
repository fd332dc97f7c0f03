"""A whole `gufo bench` invocation: models x (threads, n_batch, n_ubatch) x tests, and validation first."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gufo.engine.engine import Engine
from gufo.engine.loader import open_checked
from gufo.engine.speculative import SpeculativeParams, make_speculator
from gufo.errors import BadInputError, CheckFailedError, GufoError
from gufo.models.kv_cache import KVCache
from gufo.options import RunOptions
from gufo.parallel.engine import open_engine
from gufo.tools.bench.machine import backend_label, device_name
from gufo.tools.bench.report import make_record, model_fields
from gufo.tools.bench.runner import AroundRepetition, BenchRunner, Progress
from gufo.tools.bench.workload import BenchTest
from gufo.tools.quality.validate_prefill import PrefillValidation, add_prefill_noise, validate_prefill


@dataclass
class BenchPlan:
    models: list[str]
    tests: list[BenchTest]
    threads: list[int]
    batches: list[int]
    ubatches: list[int]
    repetitions: int = 5
    warmup: bool = True
    delay: float = 0.0
    options: RunOptions = field(default_factory=RunOptions)  # device, graphs, kernel options
    validate_prefill: int | None = None
    prefill_noise: tuple[int, float] | None = None  # debug hook: (layer, std), see add_prefill_noise
    speculative: SpeculativeParams | None = None  # adds speculative twins of generation tests
    draft_model: str | None = None
    tensor_parallel: int = 1  # processes (torchrun ranks) the model is sharded over
    around_repetition: AroundRepetition | None = None  # `gufo profile`: a range around each timed run

    @property
    def needed_context(self) -> int:
        return max([t.n_tokens for t in self.tests] + [self.validate_prefill or 0])


# llama-bench's type_k / type_v names (ggml type names) of the cache element types gufo uses
CACHE_TYPE_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def cache_type_name(cache: KVCache) -> str:
    return CACHE_TYPE_NAMES[cache.dtype]


def preflight(plan: BenchPlan) -> None:
    """Check every model file and the context the tests need before anything runs or prints."""
    for name in plan.models:
        _, model_file = open_checked(name)
        limit = int(model_file.arch_key("context_length"))
        if plan.needed_context > limit:
            raise BadInputError(
                f"{name}: the tests need {plan.needed_context} tokens of context (depth + prompt + "
                f"generation), the model has {limit}"
            )


class EngineCache:
    """Holds the most recently loaded model, so validating then benchmarking one model loads it once."""

    def __init__(self, plan: BenchPlan):
        self.plan = plan
        self.name: str | None = None
        self.engine: Engine | None = None

    def get(self, name: str) -> Engine:
        if name != self.name or self.engine is None:
            self.engine = None  # free the previous model before loading the next
            engine = open_engine(
                name, self.plan.options, self.plan.tensor_parallel, context=self.plan.needed_context
            )
            if self.plan.prefill_noise is not None:
                add_prefill_noise(engine, *self.plan.prefill_noise)
            self.name, self.engine = name, engine
        return self.engine


def run_validations(
    plan: BenchPlan,
    engines: EngineCache,
    report: Callable[[PrefillValidation], None],
    progress: Progress | None = None,
) -> dict[str, dict[str, object]]:
    """Validate every model before any timing; the first failure raises CheckFailedError (exit 1)."""
    results: dict[str, dict[str, object]] = {}
    if plan.validate_prefill is None:
        return results
    for name in plan.models:
        engine = engines.get(name)
        engine.batch_size = min(plan.ubatches[0], plan.batches[0])
        result = validate_prefill(engine, plan.validate_prefill, progress)
        report(result)
        if not result.passed:
            lead = f"; decode's top-1 leads its runner-up by {result.diff.reference_margin:.3g}"
            raise CheckFailedError(
                f"{name}: prefill validation failed (decode and batched prefill disagree"
                f"{lead if result.diff.finite else ''})"
            )
        results[name] = result.as_dict()
    return results


def run_benchmarks(
    plan: BenchPlan,
    engines: EngineCache,
    validations: dict[str, dict[str, object]],
    build: dict[str, object],
    progress: Progress | None = None,
) -> Iterator[dict[str, object]]:
    """Yield one record per test as it finishes (`build`: machine.build_info() of the run).
    A failure mid-run becomes GufoError (exit 1)."""
    for name in plan.models:
        engine = engines.get(name)
        model = model_fields(engine.file)
        for n_threads, n_batch, n_ubatch in itertools.product(plan.threads, plan.batches, plan.ubatches):
            engine.set_threads(n_threads)
            engine.batch_size = min(n_ubatch, n_batch)
            run_fields = {
                "backends": backend_label(engine.device),
                "n_batch": n_batch,
                "n_ubatch": n_ubatch,
                "n_threads": n_threads,
                "type_k": cache_type_name(engine.cache),
                "type_v": cache_type_name(engine.cache),
                "n_gpu_layers": 0 if engine.device == "cpu" else engine.config.n_layers,
                "device": engine.device,
                "device_name": device_name(engine.device),
                "routes": engine.model.routes(),
                "options": engine.options.record(),
                "prefill_validation": validations.get(name),
                "tensor_parallel": engine.tensor_parallel,
            }
            speculator = None
            if plan.speculative is not None:
                speculator = make_speculator(engine, plan.speculative, plan.draft_model)
                spec = plan.speculative
                run_fields["speculative"] = {
                    "draft_max": spec.draft_max,
                    "draft_min": spec.draft_min,
                    "ngram_min": spec.ngram_min,
                    **({"draft_model": Path(plan.draft_model).name} if plan.draft_model else {}),
                }
            runner = BenchRunner(
                engine,
                plan.repetitions,
                n_batch,
                plan.warmup,
                plan.delay,
                progress,
                speculator,
                plan.around_repetition,
            )
            timings = runner.run(plan.tests)
            while True:
                try:
                    timing = next(timings)
                except StopIteration:
                    break
                except GufoError:
                    raise
                except Exception as err:  # one line and exit 1; the rows already printed stay valid
                    raise GufoError(f"{name}: benchmark failed: {type(err).__name__}: {err}") from None
                run_fields["graph_capture_s"] = round(engine.graph_capture_seconds, 3)
                run_fields["rank_peak_memory"] = engine.rank_peak_memory()
                yield make_record(build, model, run_fields, timing)

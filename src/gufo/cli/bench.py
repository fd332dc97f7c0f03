"""`gufo bench`: llama-bench's flags and output, plus --validate-prefill (the work is in gufo.tools.bench)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from gufo.cli.commands import summary
from gufo.cli.common import (
    NOISE_ENV,
    add_eager_flag,
    add_speculative_flags,
    add_tensor_parallel_flag,
    parse_noise,
    positive_int,
    run_options,
    speculative_params,
    warn_about_threads,
)
from gufo.cli.compat import add_device_flags, add_llama_compat_flags
from gufo.errors import BadInputError
from gufo.gguf.aliases import DEFAULT_MODEL
from gufo.tools.bench.defaults import DEFAULT_N_BATCH, DEFAULT_N_UBATCH, FORMATS
from gufo.tools.bench.lists import parse_int_list, parse_pair, parse_positive_list

if TYPE_CHECKING:
    from gufo.tools.bench.runner import Progress
    from gufo.tools.bench.session import BenchPlan
    from gufo.tools.quality.validate_prefill import PrefillValidation

EPILOG = f"""\
Lists take a,b,c and ranges first-last, first-last+step, first-last*mult (e.g. -p 64-1024*2).
A 0 in -p or -n drops that kind of test. Every combination of -b, -ub and -t runs for every model;
tests run in llama-bench's order: per depth, prompt tests, generation tests, then -pg pairs.
Rate per repetition = (n_prompt + n_gen) / seconds; t/s = mean +- sample standard deviation (n-1).

Debugging the validation: {NOISE_ENV}=LAYER:STD adds Gaussian noise of that standard deviation to
one layer's output on batched (prefill) passes only, so --validate-prefill must fail.

Exit codes: 0 success, 1 a validation or a run failed (rows already printed stay valid), 2 bad input."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help=summary("bench"),
        description="Time prefill (pp) and decode (tg) with llama-bench's semantics and output formats: "
        "random token ids (BOS first), depth prefilled untimed and restored before each repetition, one "
        "untimed warm-up per test.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_workload_flags(parser)
    parser.add_argument("-o", "--output", choices=FORMATS, default="md", help="format on stdout (default md)")
    parser.add_argument(
        "-oe",
        "--output-err",
        choices=FORMATS,
        default=None,
        help="also print results in this format on stderr",
    )
    parser.add_argument(
        "--delay",
        type=float,
        default=0.0,
        metavar="S",
        help="sleep S seconds before each repetition",
    )
    parser.add_argument(
        "--validate-prefill",
        type=int,
        default=None,
        metavar="N",
        help="first compare the final logits of N random tokens fed one at a time (decode path) with the "
        "same N in one batched prefill; print two [Prefill Validation] lines on stderr; exit 1 before any "
        "table unless both are finite with the same top-1 token (sequential_margin: the decode path's top-1 "
        "lead over its runner-up, to tell a near-tie from a fault). With -p 0 -n 0 it runs alone",
    )
    add_tensor_parallel_flag(parser)
    parser.set_defaults(func=run)


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say what is timed (`gufo profile` runs the same workload)."""
    parser.add_argument(
        "-m",
        "--model",
        action="append",
        help=f"GGUF path or alias; repeat the flag or give a comma list (default: {DEFAULT_MODEL})",
    )
    parser.add_argument("-p", "--n-prompt", default="512", help="prompt lengths to time (default 512)")
    parser.add_argument("-n", "--n-gen", default="128", help="generation lengths to time (default 128)")
    parser.add_argument(
        "-pg",
        dest="prompt_gen",
        action="append",
        default=[],
        metavar="PP,TG",
        help="time a PP-token prompt followed by TG generated tokens as one test; repeatable",
    )
    parser.add_argument(
        "-d", "--n-depth", default="0", help="context already filled (untimed) before each test (default 0)"
    )
    parser.add_argument(
        "-r", "--repetitions", type=positive_int, default=5, help="timed repetitions per test (default 5)"
    )
    parser.add_argument(
        "-b",
        "--batch-size",
        default=str(DEFAULT_N_BATCH),
        help=f"logical batch: prompt tokens handed to the engine per call (default {DEFAULT_N_BATCH})",
    )
    parser.add_argument(
        "-ub",
        "--ubatch-size",
        default=str(DEFAULT_N_UBATCH),
        help=f"physical batch: prompt tokens per forward pass (default {DEFAULT_N_UBATCH})",
    )
    parser.add_argument(
        "-t",
        "--threads",
        default=None,
        help="CPU threads, a list (default: torch's, the number of cores; idle threads sleep rather than "
        "spin unless OMP_WAIT_POLICY says otherwise)",
    )
    add_device_flags(parser)
    add_eager_flag(parser)
    add_llama_compat_flags(parser, mlock=False)
    parser.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of each test")
    parser.add_argument(
        "--progress",
        action="store_true",
        help="report progress on stderr (default: when it is a terminal)",
    )
    add_speculative_flags(parser)


def make_plan(args: argparse.Namespace) -> BenchPlan:
    import torch

    from gufo.tools.bench.runner import plan_tests, with_speculative
    from gufo.tools.bench.session import BenchPlan

    names = [name for value in (args.model or [DEFAULT_MODEL]) for name in value.split(",")]
    if not all(names):
        raise BadInputError(f"-m: empty model name in {','.join(args.model)!r}")
    tests = plan_tests(
        parse_int_list(args.n_prompt, "-p"),
        parse_int_list(args.n_gen, "-n"),
        [parse_pair(text, "-pg") for text in args.prompt_gen],
        parse_int_list(args.n_depth, "-d"),
    )
    threads = parse_positive_list(args.threads, "-t") if args.threads else [torch.get_num_threads()]
    warn_about_threads(threads)
    speculative = speculative_params(args)
    if speculative is not None:
        tests = with_speculative(tests, speculative.mode)
    if args.validate_prefill is not None and args.validate_prefill < 2:
        raise BadInputError(f"--validate-prefill needs at least 2 tokens, got {args.validate_prefill}")
    if not tests and args.validate_prefill is None:
        raise BadInputError(
            "nothing to run: every -p, -n and -pg value is 0 (add tests or --validate-prefill)"
        )
    if args.delay < 0:
        raise BadInputError(f"--delay must be >= 0, got {args.delay}")
    if args.tensor_parallel > 1 and len(names) > 1:
        raise BadInputError(f"--tensor-parallel {args.tensor_parallel} takes one model, got {len(names)}")
    return BenchPlan(
        models=names,
        tests=tests,
        threads=threads,
        batches=parse_positive_list(args.batch_size, "-b"),
        ubatches=parse_positive_list(args.ubatch_size, "-ub"),
        repetitions=args.repetitions,
        warmup=not args.no_warmup,
        delay=args.delay,
        options=run_options(args),
        validate_prefill=args.validate_prefill,
        prefill_noise=parse_noise(),
        speculative=speculative,
        draft_model=args.draft_model,
        tensor_parallel=args.tensor_parallel,
    )


def progress_callback(args: argparse.Namespace, command: str = "bench") -> Progress | None:
    if not (args.progress or sys.stderr.isatty()):
        return None
    return lambda message: print(f"gufo {command}: {message}", file=sys.stderr, flush=True)


def print_validation(result: PrefillValidation) -> None:
    for line in result.lines():
        print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from gufo.parallel.engine import follows
    from gufo.parallel.mirror import follow
    from gufo.tools.bench.machine import build_info
    from gufo.tools.bench.report import make_printer
    from gufo.tools.bench.session import EngineCache, preflight, run_benchmarks, run_validations

    plan = make_plan(args)
    preflight(plan)
    engines = EngineCache(plan)
    if plan.tensor_parallel > 1:  # every rank joins (or is refused) before anything prints
        engine = engines.get(plan.models[0])
        if follows(engine):  # rank 0 benchmarks and prints; the others run its steps
            return follow(engine)
    progress = progress_callback(args)
    validations = run_validations(plan, engines, print_validation, progress)
    if not plan.tests:
        return 0
    show_batch, show_ubatch = plan.batches != [DEFAULT_N_BATCH], plan.ubatches != [DEFAULT_N_UBATCH]
    printers = [make_printer(args.output, sys.stdout, show_batch, show_ubatch)]
    if args.output_err:
        printers.append(make_printer(args.output_err, sys.stderr, show_batch, show_ubatch))
    build = build_info()  # once per run: the footer and every row share it
    for printer in printers:
        printer.begin()
    try:
        for record in run_benchmarks(plan, engines, validations, build, progress):
            for printer in printers:
                printer.row(record)
    finally:
        for printer in printers:
            printer.end(build)
    return 0

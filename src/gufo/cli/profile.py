"""`gufo profile`: `gufo bench`'s workload under torch.profiler, per stage and kernel; `--compare` two
profiles (the work is in gufo.tools.profile)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from gufo.cli.bench import add_workload_flags, make_plan, progress_callback
from gufo.cli.commands import summary
from gufo.cli.common import positive_float
from gufo.errors import BadInputError, CheckFailedError
from gufo.options import STAGE_OF_OP, ProfileOptions

EPILOG = """\
The workload is gufo bench's (same flags, same token ids, same warm-up); only the timed repetitions
are tabulated, each split into stages named from the engine's ops: linear.<block format>,
experts.<block format> (mixture-of-experts products), attention,
norm, norm_rope, rope, activation, conv, delta_rule, decode_layer (the fused CPU decode layer, one C
call per layer), and per phase (prefill, decode): other (host time in a pass outside the kernels on
the CPU; kernels outside the stages on a GPU), copy, graph and host overhead (GPU: kernels a CUDA graph
replayed, which no stage range tells apart; device idle in a pass), and between_passes (the runner's
loop; sampling and drafting in speculative tests). Time per token divides by the phase's tokens. On a
GPU the device kernels are timed (CUPTI/roctracer), each in the stage it was launched from (found by
its linked op, else its launch call, Triton's cuLaunchKernelEx included); a CUDA graph replay runs no
Python, so the step a graph would replay runs uncaptured, op by op (the same kernels; host overhead is
then the launch cost that graphs remove), and prefill runs eagerly (the same kernels as its piecewise
graphs). --eager profiles the plain eager decode path instead.

The profiler adds its own cost: gufo bench remains the measure of speed.

--compare A.json B.json: per test, stage and kernel, the time per token of B against A; a change is
'(noise)' under gufo compare's rule (within the combined standard error of the two means over the
repetitions; with -r 1 any difference counts). --fail-above PCT exits 1 when a stage is more than PCT%
slower in B, beyond noise.

Debugging: --debug-slow-stage STAGE sleeps 2 ms inside every launch of that stage (a stage name, or
linear for every block format), so --compare against a plain run must flag that stage alone.
--debug-events FILE writes the profiler's events as read: counts per activity type, how many device
kernels were placed by their linked host op, by their launch call's correlation id, by their time
alone or not at all, the raw fields (activity, device, name, thread, times, correlation ids) of the
first events, and those of the first timed pass's device events with the stage each went to.

Exit codes: 0 success, 1 a run failed or a stage regressed beyond --fail-above, 2 bad input."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help=summary("profile"),
        description="Run gufo bench's workload on one model under torch.profiler (PyTorch's tracer: "
        "CUPTI on NVIDIA, roctracer on ROCm, host events on the CPU) and report where the time goes per "
        "stage and per kernel: launches, time, share, time per token, weight bytes read and GB/s.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_workload_flags(parser)
    parser.add_argument(
        "-o", "--output", choices=("md", "json"), default="md", help="format on stdout (default md)"
    )
    parser.add_argument("--trace", type=Path, metavar="FILE", help="write the Chrome/Perfetto trace (JSON)")
    parser.add_argument(
        "--plot", type=Path, metavar="FILE.png", help="draw the stage shares, stacked (needs matplotlib)"
    )
    parser.add_argument(
        "--peak-bandwidth",
        type=positive_float,
        metavar="GB/S",
        help="the device's memory bandwidth: rows that read weights show their GB/s as a %% of it",
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A.json", "B.json"),
        help="compare two profiles (-o json output) instead of profiling",
    )
    parser.add_argument(
        "--labels", help="--compare: labels of A and B, comma-separated (default: the file stems)"
    )
    parser.add_argument(
        "--fail-above",
        type=positive_float,
        metavar="PCT",
        help="--compare: exit 1 when a stage's time per token is more than PCT%% above A's, beyond noise",
    )
    parser.add_argument(
        "--debug-slow-stage",
        metavar="STAGE",
        help="debugging: sleep 2 ms inside every launch of STAGE (see below)",
    )
    parser.add_argument(
        "--debug-events",
        type=Path,
        metavar="FILE",
        help="debugging: describe the profiler's events and where each device kernel went (see below)",
    )
    # gufo bench's flags that profiling does not take
    parser.set_defaults(func=run, delay=0.0, validate_prefill=None, tensor_parallel=1)


def run(args: argparse.Namespace) -> int:
    if args.compare is not None:
        return compare(args)
    if args.labels is not None or args.fail_above is not None:
        raise BadInputError("--labels and --fail-above go with --compare")
    from gufo.tools.bench.machine import build_info
    from gufo.tools.profile.session import ProfilePlan, run_profile

    plan = make_plan(args)
    if len(plan.models) != 1:
        raise BadInputError(f"-m: gufo profile takes one model, got {len(plan.models)}")
    stages = sorted({*STAGE_OF_OP.values()})
    if args.debug_slow_stage is not None and args.debug_slow_stage.split(".")[0] not in stages:
        known = ", ".join(stages)
        raise BadInputError(f"--debug-slow-stage: {args.debug_slow_stage!r} is not one of {known}")
    if args.plot is not None:
        from gufo.tools.plot import pyplot

        pyplot()  # a missing matplotlib is said before the run, not after
    options = replace(plan.options, profile=ProfileOptions(slow_stage=args.debug_slow_stage))
    profile_plan = ProfilePlan(
        replace(plan, options=options), args.trace, args.peak_bandwidth, events=args.debug_events
    )
    records = run_profile(profile_plan, build_info(), progress_callback(args, "profile"))
    if args.output == "json":
        sys.stdout.write(json.dumps(records, indent=2, ensure_ascii=False) + "\n")
    else:
        from gufo.tools.profile.report import markdown

        sys.stdout.write("".join(markdown(record) for record in records))
    if args.plot is not None:
        from gufo.tools.plot import stage_shares

        stage_shares(records, args.plot)
    return 0


def compare(args: argparse.Namespace) -> int:
    from gufo.tools.profile.compare import compare_profiles

    comparison = compare_profiles(args.compare, args.labels.split(",") if args.labels else None)
    if args.output == "json":
        sys.stdout.write(json.dumps(comparison.as_json(), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(comparison.markdown())
    if args.fail_above is None:
        return 0
    regressed = comparison.regressions(args.fail_above)
    for row in regressed:
        test, phase, stage, _ = row.key
        print(
            f"gufo profile: {test} {phase} {stage}: {row.change.percent:+.1f}% time per token, beyond noise",
            file=sys.stderr,
        )
    if regressed:
        base = comparison.labels[0]
        raise CheckFailedError(f"{len(regressed)} stage(s) more than {args.fail_above:g}% slower than {base}")
    return 0

"""`gufo compare`: A/B tables across benchmark runs (the work is in gufo.tools.bench.compare)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gufo.cli.commands import summary
from gufo.errors import BadInputError
from gufo.tools.bench.compare import compare_runs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare",
        help=summary("compare"),
        description="Join runs by test (model file name, n_prompt, n_gen, n_depth) and print each run's "
        "mean ± std t/s and its change against the first run. A change is marked '(noise)' when "
        "|mean_other - mean_base| < sqrt(std_base^2/n_base + std_other^2/n_other), the combined standard "
        "error of the two means (n = number of samples; with n = 1 any difference counts).",
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN.json", help="runs: -o json or jsonl output"
    )
    parser.add_argument("--labels", help="comma-separated column labels, one per run (default: file names)")
    parser.add_argument(
        "--control",
        metavar="LABEL",
        help="a run expected to equal the base (same build twice, a neutral toolchain bump): warn on "
        "stderr for every test where it differs beyond noise",
    )
    parser.add_argument(
        "-o", "--output", choices=("md", "json"), default="md", help="table format (default md)"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw t/s against depth, a line per test and run (a -d sweep; needs matplotlib)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    labels = args.labels.split(",") if args.labels else None
    comparison = compare_runs(args.runs, labels)
    if args.plot is not None:
        from gufo.tools.plot import speed_against_depth

        speed_against_depth(comparison.labels, comparison.depth_series(), args.plot)
    if args.control is not None and args.control not in comparison.labels[1:]:
        raise BadInputError(f"--control: {args.control!r} is not one of {','.join(comparison.labels[1:])}")
    if args.output == "json":
        sys.stdout.write(json.dumps(comparison.as_json(), indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(comparison.markdown())
    if args.control is not None:
        for line in comparison.control_warnings(args.control):
            print(line, file=sys.stderr)
    return 0

"""`gufo kernels`: read compiled GPU kernels without a GPU (report, check, baseline, compare)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from gufo.cli.commands import summary
from gufo.errors import BadInputError
from gufo.options import KernelOptions
from gufo.tools.kernel_check import checker, own, report
from gufo.tools.kernel_check.loader import read_paths
from gufo.tools.kernel_check.model import Kernel


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "kernels",
        help=summary("kernels"),
        description="Read AMD code objects (raw, bundled, compressed, in host ELF/PE files), NVIDIA cubins "
        "and fatbins, and Triton cache directories; no GPU needed. `own` compiles gufo's own Triton kernels "
        "for GPU targets on the CPU and reports (or checks) them.",
    )
    sub = parser.add_subparsers(dest="kernels_command", metavar="MODE")
    sub.required = True

    p = _mode(sub, "report", _report, "list every kernel with its resources", "List every kernel.")
    p.add_argument("files", nargs="+", metavar="FILE", help="binary, bundle, host object or Triton cache dir")
    p.add_argument("--filter", metavar="TEXT", help="only kernels whose (demangled) name contains TEXT")
    _common(p)

    p = _mode(sub, "check", _check, "fail when a kernel's scratch exceeds its allowance",
              "Exit 1 if any kernel uses more scratch than the allowance file grants.")  # fmt: skip
    p.add_argument("file", metavar="FILE", help="the build to check")
    p.add_argument(
        "--baseline", required=True, metavar="ALLOW.json", help="allowance file (`kernels baseline`)"
    )
    _common(p)

    p = _mode(sub, "baseline", _baseline, "write an allowance file from a build",
              "Allow every kernel the scratch it uses now.")  # fmt: skip
    p.add_argument("file", metavar="FILE", help="the build whose usage becomes the allowance")
    p.add_argument("--write", required=True, metavar="ALLOW.json", help="allowance file to write")
    p.add_argument("--note", required=True, metavar="TEXT", help="why this baseline (compiler, commit, ...)")
    p.add_argument("--default", type=int, default=0, metavar="BYTES",
                   help="scratch allowed to kernels not in the file (default 0)")  # fmt: skip
    _common(p, json_flag=False)

    p = _mode(sub, "compare", _compare, "compare two builds kernel by kernel",
              "Per kernel in both builds: worse (scratch or spills up, occupancy down), better or same. "
              "Exit 1 if any kernel's scratch grew.")  # fmt: skip
    p.add_argument("new", metavar="NEW", help="the new build")
    p.add_argument("--base", required=True, metavar="OLD", help="the build to compare against")
    p.add_argument("--strict", action="store_true", help="exit 1 if any kernel got worse at all")
    _common(p)

    p = _mode(sub, "own", _own, "compile gufo's Triton kernels for GPU targets on the CPU and report them",
              "Compile every Triton kernel of gufo in each configuration the engine launches, for each "
              "--target, on the CPU (no GPU); then report, check (--baseline) or write (--write) an "
              "allowance.")  # fmt: skip
    p.add_argument("--target", action="append", required=True, metavar="T",
                   help="gfx1151, gfx1100, gfx942, sm_80 or sm_90 (repeat for several)")  # fmt: skip
    what = p.add_mutually_exclusive_group()
    what.add_argument("--baseline", metavar="ALLOW.json", help="exit 1 if a kernel exceeds this allowance")
    what.add_argument("--write", metavar="ALLOW.json", help="write an allowance file (needs --note)")
    p.add_argument("--note", metavar="TEXT", help="with --write: why this baseline (Triton version, commit)")
    p.add_argument("--keep", metavar="DIR", help="compile into DIR and keep it (a Triton cache; reused)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="compile in N processes (default 1)")
    p.add_argument("--first-only", metavar="GLOB", action="append", default=[],
                   help="a quicker partial check: of the kernels whose name matches GLOB (e.g. 'gemv_iq*'), "
                        "compile only the first configuration launched; repeatable")  # fmt: skip
    _common(p)


def _mode(sub: argparse._SubParsersAction, name: str, func, summary: str, description: str):
    p = sub.add_parser(name, help=summary, description=description)
    p.set_defaults(func=func)
    return p


def _common(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help="NVIDIA block size for occupancy (default: the kernel's launch bound, else 256)",
    )


def _load(paths: list[str], args: argparse.Namespace) -> list[Kernel]:
    if args.block_size is not None and not 1 <= args.block_size <= 1024:
        raise BadInputError(f"--block-size: {args.block_size} is not in 1..1024")
    kernels, warnings = read_paths(paths, args.block_size)
    for w in warnings:
        print(f"gufo: note: {w}", file=sys.stderr)
    return kernels


def _report(args: argparse.Namespace) -> int:
    kernels = _load(args.files, args)
    if args.filter:
        kernels = [k for k in kernels if args.filter in (k.display_name or k.name) or args.filter in k.name]
    if args.json:
        print(json.dumps([k.to_dict() for k in kernels], indent=2))
    elif kernels:
        print(report.kernel_table(kernels))
    else:
        print(f"no kernel matches {args.filter!r}", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    allowance = checker.load_allowance(args.baseline)
    result = checker.check(_load([args.file], args), allowance)
    print(json.dumps(result.to_dict(), indent=2) if args.json else report.check_text(result))
    return 0 if result.ok else 1


def _baseline(args: argparse.Namespace) -> int:
    if args.default < 0:
        raise BadInputError(f"--default: {args.default} is negative")
    doc = checker.make_allowance(_load([args.file], args), args.note, args.default)
    return _write_allowance(doc, args.write)


def _write_allowance(doc: dict, path: str) -> int:
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as err:
        raise BadInputError(f"{path}: cannot write: {err.strerror or err}") from None
    print(f"wrote {path}: {len(doc['kernels'])} kernel(s)")
    return 0


def _own(args: argparse.Namespace) -> int:
    if args.write and not args.note:
        raise BadInputError("--write needs --note TEXT (why this baseline)")
    if args.block_size is not None and not 1 <= args.block_size <= 1024:
        raise BadInputError(f"--block-size: {args.block_size} is not in 1..1024")
    options = KernelOptions.from_environment(os.environ)  # the kernels as `gufo run` would build them
    kernels, warnings = own.own_kernels(
        args.target, args.keep, args.jobs, args.block_size, _progress, options, tuple(args.first_only)
    )
    for w in warnings:
        print(f"gufo: note: {w}", file=sys.stderr)
    if args.write:
        return _write_allowance(checker.make_allowance(kernels, args.note), args.write)
    if args.baseline:
        result = checker.check(kernels, own.allowance_for(checker.load_allowance(args.baseline), kernels))
        print(json.dumps(result.to_dict(), indent=2) if args.json else report.check_text(result))
        return 0 if result.ok else 1
    table = report.kernel_table(kernels, files=False)  # one folder per kernel: the JSON has them
    print(json.dumps([k.to_dict() for k in kernels], indent=2) if args.json else table)
    return 0


def _progress(done: int, total: int, target: str, name: str) -> None:
    print(f"[{done}/{total}] {target} {name}", file=sys.stderr, flush=True)


def _compare(args: argparse.Namespace) -> int:
    result = checker.compare(_load([args.new], args), _load([args.base], args))
    print(json.dumps(result.to_dict(), indent=2) if args.json else report.compare_text(result))
    failed = result.count("worse") > 0 if args.strict else result.scratch_grew
    return 1 if failed else 0

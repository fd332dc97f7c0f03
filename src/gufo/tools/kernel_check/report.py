"""Text tables for `gufo kernels` (the CLI prints them; JSON goes through the records' to_dict)."""

from __future__ import annotations

from gufo.tools.kernel_check.checker import CheckResult, Comparison
from gufo.tools.kernel_check.model import Kernel

AMD_COLUMNS = (
    ("VGPR", "vgpr"), ("AGPR", "agpr"), ("SGPR", "sgpr"), ("scratch", "scratch_bytes"),
    ("vspill", "vgpr_spill"), ("sspill", "sgpr_spill"), ("LDS", "lds_bytes"), ("wave", "wavefront_size"),
    ("maxWG", "max_flat_workgroup_size"), ("waves/SIMD", "occupancy_waves_per_simd"),
)  # fmt: skip
NV_COLUMNS = (
    ("regs", "registers"), ("stack", "stack_frame_bytes"), ("smem", "shared_bytes_static"),
    ("local", "local_bytes"), ("maxThr", "max_threads_per_block"), ("warps/SM", "occupancy_warps_per_sm"),
)  # fmt: skip


def table(rows: list[list[str]], right_from: int | None = None) -> str:
    """Aligned columns; columns from `right_from` on (if given) are right-aligned."""
    right_from = len(rows[0]) if right_from is None else right_from
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [
            c.rjust(w) if i >= right_from else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _fmt(value: object) -> str:
    return "-" if value is None else str(value)


def kernel_table(kernels: list[Kernel], files: bool = True) -> str:
    """One table per vendor, kernels in file order; the occupancy column names what limits it.
    `files`: head each table with the files (and containers) its kernels come from."""
    parts = []
    for vendor, columns in (("amd", AMD_COLUMNS), ("nvidia", NV_COLUMNS)):
        group = [k for k in kernels if k.vendor == vendor]
        if not group:
            continue
        head = ["arch", "kernel", *(c for c, _ in columns)]
        if vendor == "nvidia":
            head.insert(-1, "block")
        head.append("limited by")
        rows = [head]
        for k in group:
            cells = [k.arch, k.display_name or k.name, *(_fmt(k.values.get(f)) for _, f in columns)]
            if vendor == "nvidia":
                cells.insert(-1, _fmt(k.block_size))
            rows.append([*cells, k.occupancy_limited_by])
        parts.append((_with_files(group) if files else "") + table(rows, right_from=2))
    return "\n\n".join(parts)


def _with_files(group: list[Kernel]) -> str:
    files = sorted({f"{k.file} [{k.container}]" for k in group})
    return "".join(f"# {f}\n" for f in files)


def check_text(result: CheckResult) -> str:
    lines = []
    if result.offenders:
        rows = [["kernel", "scratch", "allowed", "key"]]
        rows += [
            [o["kernel"], str(o["scratch_bytes"]), str(o["allowed"]), o["key"]] for o in result.offenders
        ]
        lines.append(f"{len(result.offenders)} kernel(s) exceed their scratch allowance:")
        lines.append(table(rows, right_from=1))
    for key in result.vanished:
        lines.append(f"note: allowance for {key} has no kernel in this build")
    verdict = "FAIL" if result.offenders else "OK"
    lines.append(f"{verdict}: {result.checked} kernel(s) checked, {len(result.offenders)} over allowance")
    return "\n".join(lines)


def compare_text(result: Comparison) -> str:
    lines = []
    changed = [p for p in result.pairs if p["verdict"] != "same"]
    if changed:
        rows = [["verdict", "arch", "kernel", "changes"]]
        for p in changed:
            desc = ", ".join(f"{c['field']} {c['base']}->{c['new']}" for c in p["changes"])
            rows.append([p["verdict"], p["arch"], p["kernel"], desc + "".join(f" ({n})" for n in p["notes"])])
        lines.append(table(rows))
    for key in result.only_new:
        lines.append(f"only in new: {key}")
    for key in result.only_base:
        lines.append(f"only in base: {key}")
    lines.append(
        f"{result.count('worse')} worse, {result.count('better')} better, {result.count('same')} same, "
        f"{len(result.only_new)} only in new, {len(result.only_base)} only in base"
        + ("; scratch grew" if result.scratch_grew else "")
    )
    return "\n".join(lines)

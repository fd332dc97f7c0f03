"""Allowance files (baseline/check) and build-to-build comparison of kernel resources."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

from gufo.errors import BadInputError
from gufo.tools.kernel_check.amdgpu import set_occupancy
from gufo.tools.kernel_check.demangle import compare_key
from gufo.tools.kernel_check.model import Kernel

SCHEMA = "gufo.kernels.allowance"
SCHEMA_VERSION = 1


def kernel_key(k: Kernel) -> str:
    """Match key across builds: target, wave64 marker on gfx10+, and the name with version stamps removed."""
    target = k.target_id or k.arch
    if k.vendor == "amd" and k.values.get("wavefront_size") == 64 and k.arch.startswith("gfx1"):
        target += ":w64"
    return f"{target}/{compare_key(k.name)}"


def keyed(kernels: list[Kernel]) -> dict[str, Kernel]:
    """Kernels by key; a key seen twice (e.g. the same kernel in two containers) keeps a #N suffix."""
    out: dict[str, Kernel] = {}
    for k in kernels:
        key, n = kernel_key(k), 2
        while key in out:
            key = f"{kernel_key(k)}#{n}"
            n += 1
        out[key] = k
    return out


# ---- allowance files -------------------------------------------------------------------------


def make_allowance(kernels: list[Kernel], note: str, default: int = 0) -> dict:
    """The allowance file for a build: every kernel allowed the scratch it uses now."""
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "note": note,
        "default_scratch_bytes": default,
        "kernels": {key: {"scratch_bytes": k.scratch} for key, k in sorted(keyed(kernels).items())},
    }


def load_allowance(path: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as err:
        raise BadInputError(f"{path}: cannot read: {err.strerror or err}") from None
    except ValueError as err:
        raise BadInputError(f"{path}: not JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadInputError(f"{path}: not an allowance file (schema must be {SCHEMA!r})")
    if doc.get("version") != SCHEMA_VERSION:
        raise BadInputError(
            f"{path}: allowance version {doc.get('version')!r} unsupported (want {SCHEMA_VERSION})"
        )
    default = doc.get("default_scratch_bytes", 0)
    entries = doc.get("kernels", {})
    if not isinstance(default, int) or default < 0:
        raise BadInputError(f"{path}: default_scratch_bytes must be a non-negative integer")
    if not isinstance(entries, dict):
        raise BadInputError(f"{path}: kernels must be an object")
    for key, entry in entries.items():
        value = entry.get("scratch_bytes") if isinstance(entry, dict) else None
        if not isinstance(value, int) or value < 0:
            raise BadInputError(f"{path}: kernels[{key!r}].scratch_bytes must be a non-negative integer")
    return doc


@dataclass
class CheckResult:
    offenders: list[dict] = field(default_factory=list)  # key, kernel, scratch_bytes, allowed
    vanished: list[str] = field(default_factory=list)  # allowance keys with no kernel in the build
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.offenders

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "offenders": self.offenders,
            "vanished": self.vanished,
        }


def check(kernels: list[Kernel], allowance: dict) -> CheckResult:
    allowed = {key: entry["scratch_bytes"] for key, entry in allowance.get("kernels", {}).items()}
    default = allowance.get("default_scratch_bytes", 0)
    result = CheckResult()
    by_key = keyed(kernels)
    for key, k in by_key.items():
        limit = allowed.get(key, default)
        result.checked += 1
        if k.scratch > limit:
            result.offenders.append({
                "key": key, "file": k.file, "kernel": k.display_name or k.name,
                "scratch_bytes": k.scratch, "allowed": limit,
            })  # fmt: skip
    result.vanished = sorted(set(allowed) - set(by_key))
    return result


# ---- comparing two builds --------------------------------------------------------------------

# (field, direction): +1 means "up is worse", -1 "down is worse".
AMD_WATCH = (("scratch_bytes", 1), ("vgpr_spill", 1), ("sgpr_spill", 1), ("occupancy_waves_per_simd", -1))
NV_WATCH = (("stack_frame_bytes", 1), ("local_bytes", 1), ("occupancy_warps_per_sm", -1))
AMD_INFO = ("vgpr", "agpr", "sgpr", "lds_bytes", "wavefront_size", "max_flat_workgroup_size")
NV_INFO = ("registers", "shared_bytes_static", "max_threads_per_block")
SCRATCH = {"scratch_bytes", "stack_frame_bytes", "local_bytes"}


@dataclass
class Comparison:
    pairs: list[dict] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    only_base: list[str] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for p in self.pairs if p["verdict"] == verdict)

    @property
    def scratch_grew(self) -> bool:
        return any(p["scratch_grew"] for p in self.pairs)

    def to_dict(self) -> dict:
        return {
            "summary": {v: self.count(v) for v in ("worse", "better", "same")}
            | {
                "only_new": len(self.only_new),
                "only_base": len(self.only_base),
                "scratch_grew": self.scratch_grew,
            },
            "kernels": self.pairs,
            "only_new": self.only_new,
            "only_base": self.only_base,
        }


def compare(new: list[Kernel], base: list[Kernel]) -> Comparison:
    new_by, base_by = keyed(new), keyed(base)
    result = Comparison()
    for key in sorted(set(new_by) & set(base_by)):
        result.pairs.append(_compare_pair(key, new_by[key], base_by[key]))
    result.only_new = sorted(set(new_by) - set(base_by))
    result.only_base = sorted(set(base_by) - set(new_by))
    return result


def _compare_pair(key: str, new: Kernel, base: Kernel) -> dict:
    watch, info = (AMD_WATCH, AMD_INFO) if new.vendor == "amd" else (NV_WATCH, NV_INFO)
    changes, worse, better = [], [], []
    for name, direction in watch:
        a, b = base.values.get(name), new.values.get(name)
        if a is None or b is None or a == b:
            continue
        changes.append({"field": name, "base": a, "new": b})
        (worse if (b - a) * direction > 0 else better).append(name)
    for name in info:
        a, b = base.values.get(name), new.values.get(name)
        if a != b:
            changes.append({"field": name, "base": a, "new": b})
    notes = []
    if "occupancy_waves_per_simd" in worse + better and _model_only(new, base):
        notes.append(f"occupancy model differs ({base.compiler} vs {new.compiler}); same resource usage")
    return {
        "key": key,
        "kernel": new.display_name or new.name,
        "arch": new.arch,
        "verdict": "worse" if worse else "better" if better else "same",
        "worse": worse,
        "better": better,
        "scratch_grew": any(f in SCRATCH for f in worse),
        "changes": changes,
        "notes": notes,
    }


def _model_only(new: Kernel, base: Kernel) -> bool:
    """True when an AMD occupancy change comes only from the compilers' different LLVM occupancy model."""
    inputs = ("vgpr", "agpr", "sgpr", "lds_bytes", "wavefront_size", "max_flat_workgroup_size")
    if (
        any(new.values.get(f) != base.values.get(f) for f in inputs)
        or new.compiler_major == base.compiler_major
    ):
        return False
    probe = copy.deepcopy(new)
    probe.compiler_major = base.compiler_major
    set_occupancy(probe)
    return probe.values["occupancy_waves_per_simd"] == base.values.get("occupancy_waves_per_simd")

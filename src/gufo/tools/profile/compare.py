"""`gufo profile --compare A.json B.json`: per test, stage and kernel, time per token of B against A.

The noise rule is `gufo compare`'s (gufo.tools.bench.compare.change), on the per-repetition samples of
time per token: a change within the combined standard error of the two means is noise; with one
repetition per run any difference counts. A stage regresses by more than PCT when B's time per token is
more than PCT% above A's, beyond noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gufo.errors import BadInputError
from gufo.tools.bench.compare import Change, Measurement, change, change_cell, model_name

RowKey = tuple[str, str, str, str]  # (test title, phase, stage, kernel or "")


def load_profile(path: Path) -> list[dict]:
    """The rows of a `gufo profile -o json` run."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadInputError(f"{path}: cannot read a profile: {err}") from None
    if not isinstance(rows, list) or not rows:
        raise BadInputError(f"{path}: expected the JSON array of gufo profile -o json")
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not isinstance(row.get("profile"), dict):
            raise BadInputError(f"{path}: row {number} has no profile (gufo profile -o json writes one)")
    return rows


def measurements(rows: list[dict]) -> dict[RowKey, Measurement]:
    out: dict[RowKey, Measurement] = {}
    for row in rows:
        title = f"{model_name(str(row['model_filename']))} {row['test']}"
        for kind in ("stages", "kernels"):
            for entry in row["profile"][kind]:
                key = (title, entry["phase"], entry["stage"], entry.get("kernel", ""))
                samples = entry["samples_per_token_us"]
                out[key] = Measurement(entry["per_token_us"], entry["per_token_us_stddev"], len(samples))
    return out


@dataclass(frozen=True)
class ComparedRow:
    key: RowKey
    base: Measurement | None
    other: Measurement | None

    @property
    def change(self) -> Change | None:
        if self.base is None or self.other is None:
            return None
        return change(self.base, self.other)

    def regressed(self, percent: float) -> bool:
        found = self.change
        return found is not None and not found.within_noise and found.percent > percent


@dataclass
class ProfileComparison:
    labels: tuple[str, str]
    rows: list[ComparedRow]

    @property
    def stages(self) -> list[ComparedRow]:
        return [row for row in self.rows if not row.key[3]]

    def regressions(self, percent: float) -> list[ComparedRow]:
        return [row for row in self.stages if row.regressed(percent)]

    def markdown(self) -> str:
        a, b = self.labels
        out = []
        for kernels in (False, True):
            columns = ["test", "phase", "stage"] + (["kernel"] if kernels else [])
            columns += [f"{a} µs/token", f"{b} µs/token", f"{b} vs {a}"]
            out += ["| " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) - 3) + "---:|" * 3]
            for row in self.rows:
                if bool(row.key[3]) != kernels:
                    continue
                cells = list(row.key[:4] if kernels else row.key[:3])
                cells += [cell(row.base), cell(row.other), change_cell(row.change)]
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
        return "\n".join(out)

    def as_json(self) -> list[dict[str, object]]:
        return [
            {
                "test": row.key[0],
                "phase": row.key[1],
                "stage": row.key[2],
                **({"kernel": row.key[3]} if row.key[3] else {}),
                "runs": {
                    label: vars(m) if m is not None else None
                    for label, m in zip(self.labels, (row.base, row.other), strict=True)
                },
                "change": vars(row.change) if row.change is not None else None,
            }
            for row in self.rows
        ]


def cell(measurement: Measurement | None) -> str:
    return "—" if measurement is None else f"{measurement.mean:.1f} ± {measurement.std:.1f}"


def compare_profiles(paths: list[Path], labels: list[str] | None = None) -> ProfileComparison:
    if len(paths) != 2:
        raise BadInputError(f"--compare takes two profiles (A.json B.json), got {len(paths)}")
    labels = labels or [p.stem for p in paths]
    if len(labels) != 2 or labels[0] == labels[1]:
        raise BadInputError(f"--labels: two different labels for A and B, got {','.join(labels)}")
    base, other = (measurements(load_profile(path)) for path in paths)
    keys = list(base) + [key for key in other if key not in base]
    rows = [ComparedRow(key, base.get(key), other.get(key)) for key in keys]
    return ProfileComparison((labels[0], labels[1]), rows)

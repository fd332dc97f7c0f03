"""`gufo compare`: join benchmark runs (gufo's or llama-bench's JSON/JSONL) by test and tabulate changes.

Noise rule: a change counts as within noise when |mean_other - mean_base| is smaller than the combined
standard error sqrt(s_base^2 / n_base + s_other^2 / n_other), where s is a run's stddev_ts and n its
number of samples. With one sample per run there is no noise estimate and any difference counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

from gufo.errors import BadInputError
from gufo.tools.bench.workload import BenchTest

REQUIRED = ("model_filename", "n_prompt", "n_gen", "avg_ts", "stddev_ts")


@dataclass(frozen=True)
class Measurement:
    mean: float
    std: float
    n: int

    @property
    def standard_error_sq(self) -> float:
        return self.std**2 / self.n


@dataclass(frozen=True)
class TestKey:
    model: str
    n_prompt: int
    n_gen: int
    n_depth: int

    @property
    def test_name(self) -> str:
        return BenchTest(self.n_prompt, self.n_gen, self.n_depth).name


@dataclass(frozen=True)
class Change:
    percent: float
    within_noise: bool


def change(base: Measurement, other: Measurement) -> Change:
    diff = other.mean - base.mean
    combined_se = math.sqrt(base.standard_error_sq + other.standard_error_sq)
    percent = 100.0 * diff / base.mean if base.mean else math.inf
    return Change(percent, abs(diff) < combined_se)


def model_name(filename: str) -> str:
    """The file name without folders (llama-bench writes the path it was given, on any OS)."""
    return PureWindowsPath(filename).name if "\\" in filename else Path(filename).name


def load_run(path: Path) -> dict[TestKey, Measurement]:
    """Rows of one run: a JSON array (`-o json`) or one object per line (`-o jsonl`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadInputError(f"{path}: cannot read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise BadInputError(f"{path}: not UTF-8 text: {err}") from None
    try:
        data = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as err:
            raise BadInputError(f"{path}: not JSON or JSONL from gufo bench or llama-bench: {err}") from None
    if not rows:
        raise BadInputError(f"{path}: no benchmark rows")
    run: dict[TestKey, Measurement] = {}
    for number, row in enumerate(rows, 1):
        missing = [f for f in REQUIRED if not isinstance(row, dict) or f not in row]
        if missing:
            raise BadInputError(f"{path}: row {number} lacks {', '.join(missing)}")
        key = TestKey(
            model_name(str(row["model_filename"])), row["n_prompt"], row["n_gen"], row.get("n_depth", 0)
        )
        if key in run:
            raise BadInputError(
                f"{path}: two rows for {key.model} {key.test_name}; compare one configuration per file"
            )
        samples = row.get("samples_ts") or [row["avg_ts"]]
        run[key] = Measurement(float(row["avg_ts"]), float(row["stddev_ts"]), len(samples))
    return run


@dataclass
class Comparison:
    labels: list[str]
    keys: list[TestKey]  # in the order the base run (then the others) listed them
    runs: list[dict[TestKey, Measurement]]

    def change(self, key: TestKey, index: int) -> Change | None:
        base, other = self.runs[0].get(key), self.runs[index].get(key)
        return change(base, other) if base is not None and other is not None else None

    def control_warnings(self, control: str) -> list[str]:
        index = self.labels.index(control)
        warnings = []
        for key in self.keys:
            found = self.change(key, index)
            if found is not None and not found.within_noise:
                warnings.append(
                    f"warning: control {control} differs from {self.labels[0]} on {self.title(key)} by "
                    f"{found.percent:+.2f}%, beyond noise: the machine or setup drifted"
                )
        return warnings

    def title(self, key: TestKey) -> str:
        models = {k.model for k in self.keys}
        return key.test_name if len(models) == 1 else f"{key.model} {key.test_name}"

    def markdown(self) -> str:
        header = ["test", self.labels[0]]
        for label in self.labels[1:]:
            header += [label, f"{label} vs {self.labels[0]}"]
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
        ]
        for key in self.keys:
            cells = [self.title(key), cell(self.runs[0].get(key))]
            for index in range(1, len(self.runs)):
                cells += [cell(self.runs[index].get(key)), change_cell(self.change(key, index))]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def depth_series(self) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
        """Test at depth 0 (e.g. `tg128`, the model named when runs hold several) -> run label ->
        (depth, mean t/s, std) points: the speed of each run against the depth of a sweep."""
        models = {k.model for k in self.keys}
        series: dict[str, dict[str, list[tuple[int, float, float]]]] = {}
        for key in self.keys:
            name = TestKey(key.model, key.n_prompt, key.n_gen, 0).test_name
            runs = series.setdefault(name if len(models) == 1 else f"{key.model} {name}", {})
            for label, run in zip(self.labels, self.runs, strict=True):
                if key in run:
                    runs.setdefault(label, []).append((key.n_depth, run[key].mean, run[key].std))
        return series

    def as_json(self) -> list[dict[str, object]]:
        out = []
        for key in self.keys:
            runs = {
                label: vars(run[key]) if key in run else None
                for label, run in zip(self.labels, self.runs, strict=True)
            }
            changes = {}
            for index, label in enumerate(self.labels[1:], 1):
                found = self.change(key, index)
                changes[label] = vars(found) if found is not None else None
            out.append({**vars(key), "test": key.test_name, "runs": runs, "changes_vs_base": changes})
        return out


def cell(measurement: Measurement | None) -> str:
    return "—" if measurement is None else f"{measurement.mean:.2f} ± {measurement.std:.2f}"


def change_cell(found: Change | None) -> str:
    if found is None:
        return "—"
    return f"{found.percent:+.2f}%" + (" (noise)" if found.within_noise else "")


def compare_runs(paths: list[Path], labels: list[str] | None = None) -> Comparison:
    if len(paths) < 2:
        raise BadInputError("compare needs at least two runs")
    labels = labels or [p.stem for p in paths]
    if len(labels) != len(paths):
        raise BadInputError(f"--labels: {len(labels)} labels for {len(paths)} runs")
    if len(set(labels)) != len(labels):
        raise BadInputError(f"--labels: labels must differ, got {','.join(labels)}")
    runs = [load_run(p) for p in paths]
    keys: list[TestKey] = []
    for run in runs:
        keys += [k for k in run if k not in keys]
    return Comparison(labels, keys, runs)

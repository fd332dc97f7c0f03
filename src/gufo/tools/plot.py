"""PNG plots with matplotlib (the optional extra: pip install 'gufo[plot]'): a profile's stage shares
stacked per test, and t/s against depth per run of a benchmark comparison.

Every figure is WIDTH x HEIGHT pixels (a fixed size and dpi, laid out inside it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gufo.errors import BadInputError

WIDTH, HEIGHT, DPI = 1200, 600, 100  # pixels, pixels per inch
# a profile's rows of time outside the kernel calls (gufo.tools.profile.stages), stacked last
REMAINDER = ("other", "copy", "host overhead", "between_passes")


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend; one clear line when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise BadInputError("--plot needs matplotlib: pip install 'gufo[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(plt: Any) -> tuple[Any, Any]:
    return plt.subplots(figsize=(WIDTH / DPI, HEIGHT / DPI), dpi=DPI, layout="constrained")


def save(plt: Any, fig: Any, path: Path) -> None:
    try:
        fig.savefig(path, dpi=DPI, format="png")
    except OSError as err:
        raise BadInputError(f"--plot {path}: cannot write: {err}") from None
    finally:
        plt.close(fig)


def stage_shares(records: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One bar per profiled test, its stages' shares of the time stacked (a stage's phases together),
    the largest stages at the bottom and the time outside the kernels (REMAINDER) on top."""
    plt = pyplot()
    fig, ax = figure(plt)
    totals: dict[str, float] = {}
    for record in records:
        for row in record["profile"]["stages"]:
            totals[row["stage"]] = totals.get(row["stage"], 0.0) + row["share_pct"]
    stages = sorted(totals, key=lambda stage: (stage in REMAINDER, -totals[stage]))
    labels = [str(record["test"]) for record in records]
    bottoms = [0.0] * len(records)
    colours = plt.get_cmap("tab20")
    for index, stage in enumerate(stages):
        shares = [
            sum(row["share_pct"] for row in record["profile"]["stages"] if row["stage"] == stage)
            for record in records
        ]
        ax.bar(labels, shares, bottom=bottoms, label=stage, color=colours(index % 20))
        bottoms = [b + s for b, s in zip(bottoms, shares, strict=True)]
    where = f" ({records[0]['model_type']}, {records[0]['backends']})" if records else ""
    ax.set_title(f"gufo profile: where the time goes{where}")
    ax.set_ylabel("share of the profiled time (%)")
    ax.set_ylim(0, 100)
    fig.legend(loc="outside right upper", fontsize="small")
    save(plt, fig, path)


def speed_against_depth(
    labels: Sequence[str], series: Mapping[str, Mapping[str, list[tuple[int, float, float]]]], path: Path
) -> None:
    """series: test (e.g. `tg128`) -> run label -> (depth, mean t/s, std) points; a line per (test, run)."""
    plt = pyplot()
    fig, ax = figure(plt)
    markers = "osD^v<>"
    for index, (test, runs) in enumerate(series.items()):
        for label in labels:
            points = sorted(runs.get(label, []))
            if points:
                depths, means, stds = zip(*points, strict=True)
                ax.errorbar(depths, means, yerr=stds, marker=markers[index % len(markers)], capsize=3,
                            label=f"{test} {label}")  # fmt: skip
    ax.set_xlabel("depth (tokens already in the context)")
    ax.set_ylabel("tokens per second")
    ax.set_title("gufo compare: speed against depth")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize="small")
    save(plt, fig, path)

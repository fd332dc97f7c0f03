"""A profiled test's rows: per stage and per kernel, launches, time, share, time per token, bytes, GB/s.

Time per token divides a row's time by the tokens of its phase (a prefill row by the prompt's tokens, a
decode row by the generated ones, `between_passes` by both); one sample per repetition, so that
`gufo profile --compare` can apply `gufo compare`'s noise rule. Bytes are the weights the kernel calls
read (gufo.kernels.profiling), GB/s those bytes over the row's time.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from gufo.tools.bench.runner import sample_stddev
from gufo.tools.bench.workload import REPEAT_BLOCK, REPEATS, BenchTest
from gufo.tools.profile.stages import NO_PHASE, RepetitionProfile, Tally

PHASE_ORDER = ("prefill", "decode", NO_PHASE)


def phase_tokens(test: BenchTest) -> dict[str, int]:
    """Tokens per phase of one repetition (a speculative test's profile also covers its prompt)."""
    prompt = REPEAT_BLOCK * REPEATS if test.speculative else test.n_prompt
    return {"prefill": prompt, "decode": test.n_gen, NO_PHASE: test.n_prompt + test.n_gen}


@dataclass
class Row:
    phase: str
    stage: str
    kernel: str | None
    launches: int
    ns: int
    bytes: int
    samples_ns_per_token: list[float]  # one per repetition

    def as_dict(self, total_ns: int, peak_gbs: float | None) -> dict[str, object]:
        gbs = self.bytes / self.ns if self.bytes and self.ns > 0 else None  # bytes per ns = GB/s
        return {
            "phase": self.phase,
            "stage": self.stage,
            **({"kernel": self.kernel} if self.kernel is not None else {}),
            "launches": self.launches,
            "total_ms": round(self.ns / 1e6, 6),
            "share_pct": round(100.0 * self.ns / total_ns, 4) if total_ns else 0.0,
            "per_token_us": round(statistics.fmean(self.samples_ns_per_token) / 1e3, 6),
            "per_token_us_stddev": round(sample_stddev(self.samples_ns_per_token) / 1e3, 6),
            "samples_per_token_us": [round(ns / 1e3, 6) for ns in self.samples_ns_per_token],
            "bytes": self.bytes,
            "gb_per_s": round(gbs, 4) if gbs is not None else None,
            "peak_pct": round(100.0 * gbs / peak_gbs, 2) if gbs is not None and peak_gbs else None,
        }


def order(row: Row) -> tuple[int, int]:
    return PHASE_ORDER.index(row.phase), -row.ns


def rows_of(repetitions: list[RepetitionProfile], tokens: Mapping[str, int], kernels: bool) -> list[Row]:
    """The stage rows (or kernel rows) summed over the repetitions, largest first within each phase."""
    keys: list[tuple[str, ...]] = []
    for rep in repetitions:
        table = rep.kernels if kernels else rep.stages
        keys += [key for key in table if key not in keys]
    rows = []
    for key in keys:
        tallies = [(rep.kernels if kernels else rep.stages).get(key, Tally()) for rep in repetitions]
        per_token = [t.ns / max(tokens[key[0]], 1) for t in tallies]
        rows.append(
            Row(
                key[0],
                key[1],
                key[2] if kernels else None,
                sum(t.launches for t in tallies),
                sum(t.ns for t in tallies),
                sum(t.bytes for t in tallies),
                per_token,
            )
        )
    return sorted(rows, key=order)


def profile_fields(
    test: BenchTest,
    repetitions: list[RepetitionProfile],
    device_activity: str,
    peak_gbs: float | None,
) -> dict[str, object]:
    """The `profile` object of a test's JSON row."""
    tokens = phase_tokens(test)
    total = sum(rep.ns for rep in repetitions)
    return {
        "activity": device_activity,  # what was timed: "cpu" (host ranges) or "cuda" (device kernels)
        "repetitions": len(repetitions),
        "tokens": tokens,
        "total_ms": round(total / 1e6, 6),
        "peak_gb_per_s": peak_gbs,
        "stages": [row.as_dict(total, peak_gbs) for row in rows_of(repetitions, tokens, kernels=False)],
        "kernels": [row.as_dict(total, peak_gbs) for row in rows_of(repetitions, tokens, kernels=True)],
    }


def cell(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def markdown(record: Mapping[str, object]) -> str:
    """One test's tables: stages, then kernels."""
    profile = record["profile"]
    total_ms = profile["total_ms"]
    wall_ms = sum(record["samples_ns"]) / 1e6
    head = (
        f"### {record['model_type']} · {record['test']} · {record['backends']} · threads "
        f"{record['n_threads']} · repetitions {profile['repetitions']}: {total_ms:.1f} ms profiled, "
        f"{wall_ms:.1f} ms timed by the runner\n\n"
    )
    stage_lines = [
        "| phase | stage | launches | ms | share | µs/token | MB/token | GB/s | % peak |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tokens = profile["tokens"]
    for row in profile["stages"]:
        per_token_mb = row["bytes"] / max(tokens[row["phase"]], 1) / profile["repetitions"] / 1e6
        stage_lines.append(
            f"| {row['phase']} | {row['stage']} | {row['launches']} | {row['total_ms']:.2f} | "
            f"{row['share_pct']:.1f}% | {row['per_token_us']:.1f} | {cell(per_token_mb or None, 2)} | "
            f"{cell(row['gb_per_s'], 2)} | {cell(row['peak_pct'], 1)} |"
        )
    kernel_lines = [
        "| phase | stage | kernel | launches | ms | share | µs/token |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row in profile["kernels"]:
        kernel_lines.append(
            f"| {row['phase']} | {row['stage']} | {row['kernel']} | {row['launches']} | "
            f"{row['total_ms']:.2f} | {row['share_pct']:.1f}% | {row['per_token_us']:.1f} |"
        )
    return head + "\n".join(stage_lines) + "\n\n" + "\n".join(kernel_lines) + "\n\n"

"""Rows of a benchmark run and the four output formats (llama-bench's field names and layouts).

Each printer writes a row as soon as its test finishes, so an interrupted run leaves valid rows behind
(the JSON printer still closes its array).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import TextIO

import gguf

from gufo.gguf.model_file import ModelFile
from gufo.tools.bench.runner import Timing


def ftype_name(file_type: int | None) -> str:
    """llama.cpp's wording for general.file_type, e.g. 15 -> `Q4_K - Medium`."""
    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return "unknown"
    if name == "ALL_F32":
        return "all F32"
    name = name.removeprefix("MOSTLY_")
    size = {"S": "Small", "M": "Medium", "L": "Large"}
    if name == "Q2_K":
        return "Q2_K - Medium"
    head, _, tail = name.rpartition("_")
    if head.endswith("_K") and tail in size:
        return f"{head} - {size[tail]}"
    return name


def model_fields(model_file: ModelFile) -> dict[str, object]:
    """llama-bench's model columns; the file name without its folder, so rows carry no machine paths."""
    n_params = model_file.n_parameters()
    label = f"{n_params / 1e9:.0f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
    return {
        "model_filename": model_file.path.name,
        "model_type": f"{model_file.architecture} {label} {ftype_name(model_file.get('general.file_type'))}",
        "model_size": sum(info.n_bytes for info in model_file.tensors.values()),
        "model_n_params": n_params,
    }


def make_record(
    build: Mapping[str, object], model: Mapping[str, object], run: Mapping[str, object], timing: Timing
) -> dict[str, object]:
    """One row: llama-bench's fields in llama-bench's order, then gufo's own."""
    test = timing.test
    return {
        **{k: build[k] for k in ("build_commit", "build_number", "cpu_info", "gpu_info")},
        "backends": run["backends"],
        **model,
        **{k: run[k] for k in ("n_batch", "n_ubatch", "n_threads", "type_k", "type_v", "n_gpu_layers")},
        "n_prompt": test.n_prompt,
        "n_gen": test.n_gen,
        "n_depth": test.n_depth,
        "test_time": timing.test_time,
        "avg_ns": timing.avg_ns,
        "stddev_ns": timing.stddev_ns,
        "avg_ts": round(timing.avg_ts, 6),
        "stddev_ts": round(timing.stddev_ts, 6),
        "samples_ns": timing.samples_ns,
        "samples_ts": [round(ts, 6) for ts in timing.samples_ts],
        "test": test.name,
        **{k: run[k] for k in ("device", "device_name", "routes")},
        "options": run.get("options", {}),  # RunOptions.record(): how the engine ran
        "graph_capture_s": run.get("graph_capture_s", 0.0),  # CUDA graph capture so far (untimed)
        "tensor_parallel": run.get("tensor_parallel", 1),
        # per rank, in rank order: peak RSS on the CPU, torch.cuda.max_memory_allocated on a GPU
        **({"rank_peak_memory": run["rank_peak_memory"]} if "rank_peak_memory" in run else {}),
        **{k: build[k] for k in ("gufo_version", "torch_version", "triton_version", "machine_fingerprint")},
        **({"prefill_validation": run["prefill_validation"]} if run.get("prefill_validation") else {}),
        **(
            {"speculative": {"mode": test.speculative, **run["speculative"], **timing.speculative.as_dict()}}
            if timing.speculative is not None
            else {}
        ),
    }


def format_size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.2f} MiB"


def format_params(count: int) -> str:
    return f"{count / 1e9:.2f} B" if count >= 1e9 else f"{count / 1e6:.2f} M"


class Printer:
    def __init__(self, out: TextIO):
        self.out = out

    def begin(self) -> None:
        pass

    def row(self, record: dict[str, object]) -> None:
        raise NotImplementedError

    def end(self, build: Mapping[str, object]) -> None:
        pass

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


class MarkdownPrinter(Printer):
    """`| model | size | params | backend | threads | [n_batch] | [n_ubatch] | test | t/s |`.

    The optional columns appear when any row uses a value other than llama-bench's default.
    """

    def __init__(self, out: TextIO, show_batch: bool, show_ubatch: bool):
        super().__init__(out)
        self.columns: list[tuple[str, int, bool]] = [  # (title, width, right-aligned)
            ("model", 30, False),
            ("size", 10, True),
            ("params", 10, True),
            ("backend", 10, False),
            ("threads", 7, True),
        ]
        self.columns += [("n_batch", 7, True)] if show_batch else []
        self.columns += [("n_ubatch", 8, True)] if show_ubatch else []
        self.columns += [("test", 15, True), ("t/s", 20, True)]

    def _line(self, cells: list[str]) -> str:
        padded = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, (_, width, right) in zip(cells, self.columns, strict=True)
        ]
        return "| " + " | ".join(padded) + " |\n"

    def begin(self) -> None:
        self._write(self._line([title for title, _, _ in self.columns]))
        rules = ["-" * (width - 1) + ":" if right else "-" * width for _, width, right in self.columns]
        self._write("| " + " | ".join(rules) + " |\n")

    def row(self, record: dict[str, object]) -> None:
        values = {
            "model": record["model_type"],
            "size": format_size(int(record["model_size"])),
            "params": format_params(int(record["model_n_params"])),
            "backend": record["backends"],
            "threads": record["n_threads"],
            "n_batch": record["n_batch"],
            "n_ubatch": record["n_ubatch"],
            "test": record["test"],
            "t/s": f"{record['avg_ts']:.2f} ± {record['stddev_ts']:.2f}",
        }
        self._write(self._line([str(values[title]) for title, _, _ in self.columns]))

    def end(self, build: Mapping[str, object]) -> None:
        self._write(f"\nbuild: gufo {build['gufo_version']} ({build['build_commit']})\n")


class JsonPrinter(Printer):
    """A JSON array, one object per test, opened at the start and closed even after a failure."""

    def begin(self) -> None:
        self._write("[\n")
        self.first = True

    def row(self, record: dict[str, object]) -> None:
        self._write(("" if self.first else ",\n") + json.dumps(record, indent=2, ensure_ascii=False))
        self.first = False

    def end(self, build: Mapping[str, object]) -> None:
        self._write("\n]\n")


class JsonlPrinter(Printer):
    def row(self, record: dict[str, object]) -> None:
        self._write(json.dumps(record, ensure_ascii=False) + "\n")


def csv_cell(value: object) -> object:
    """Lists join with `;`, mappings as `key=value;...`, so every row stays one CSV line."""
    if isinstance(value, Mapping):
        return ";".join(f"{k}={csv_cell(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ";".join(str(v) for v in value)
    return value


class CsvPrinter(Printer):
    def __init__(self, out: TextIO):
        super().__init__(out)
        self.header_written = False

    def row(self, record: dict[str, object]) -> None:
        buffer = io.StringIO()
        writer = csv.writer(buffer, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
        if not self.header_written:
            writer.writerow(list(record))
            self.header_written = True
        writer.writerow([csv_cell(v) for v in record.values()])
        self._write(buffer.getvalue())


def make_printer(kind: str, out: TextIO, show_batch: bool = False, show_ubatch: bool = False) -> Printer:
    if kind == "md":
        return MarkdownPrinter(out, show_batch, show_ubatch)
    return {"json": JsonPrinter, "jsonl": JsonlPrinter, "csv": CsvPrinter}[kind](out)

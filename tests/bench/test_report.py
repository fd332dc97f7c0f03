"""Statistics against hand-computed values, and the markdown / JSON / JSONL / CSV layouts."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch

from gufo.models.kv_cache import KVCache
from gufo.tools.bench.report import ftype_name, make_printer, make_record
from gufo.tools.bench.runner import Timing, plan_tests
from gufo.tools.bench.session import cache_type_name
from gufo.tools.bench.workload import BenchTest

BUILD = {
    "build_commit": "abc1234",
    "build_number": 0,
    "cpu_info": "Some CPU",
    "gpu_info": "",
    "gufo_version": "0.1.0",
    "torch_version": "2.13.0",
    "triton_version": "",
    "machine_fingerprint": "0123456789abcdef",
}
MODEL = {
    "model_filename": "m.gguf",
    "model_type": "llama 135M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
}
RUN = {
    "backends": "CPU",
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "type_k": "f32",
    "type_v": "f32",
    "n_gpu_layers": 0,
    "device": "cpu",
    "device_name": "Some CPU",
    "routes": {"linear.Q4_1": "cpu:cpu-int8-avx2"},
}


def test_test_names_and_llama_bench_order():
    tests = plan_tests([0, 512], [128], [(512, 128)], [0, 4096])
    assert [t.name for t in tests] == [
        "pp512",
        "tg128",
        "pp512+tg128",
        "pp512 @ d4096",
        "tg128 @ d4096",
        "pp512+tg128 @ d4096",
    ]
    assert plan_tests([0], [0], [], [0]) == []


def test_statistics_by_hand():
    # 10 prompt tokens in 1 s and in 2 s: rates 10 and 5 t/s; mean 7.5; sample stddev sqrt(2 * 2.5^2 / 1).
    timing = Timing(BenchTest(10, 0), [1_000_000_000, 2_000_000_000])
    assert timing.samples_ts == [10.0, 5.0]
    assert timing.avg_ts == 7.5
    assert timing.stddev_ts == pytest.approx(3.5355339059)
    assert timing.avg_ns == 1_500_000_000
    assert timing.stddev_ns == 707_106_781
    # pp + tg: the rate counts both kinds of tokens.
    assert Timing(BenchTest(6, 2), [4_000_000_000]).samples_ts == [2.0]


def test_one_repetition_has_zero_stddev():
    timing = Timing(BenchTest(0, 128), [2_000_000_000])
    assert timing.avg_ts == 64.0 and timing.stddev_ts == 0.0 and timing.stddev_ns == 0


def test_ftype_names_follow_llama_cpp():
    assert ftype_name(15) == "Q4_K - Medium"
    assert ftype_name(14) == "Q4_K - Small"
    assert ftype_name(3) == "Q4_1"
    assert ftype_name(7) == "Q8_0"
    assert ftype_name(0) == "all F32"
    assert ftype_name(10) == "Q2_K - Medium"
    assert ftype_name(None) == "unknown"


def records():
    timings = [
        Timing(BenchTest(512, 0), [1_000_000_000, 1_024_000_000]),
        Timing(BenchTest(0, 128, 4096), [4_000_000_000, 2_000_000_000, 4_000_000_000]),
    ]
    return [make_record(BUILD, MODEL, RUN, t) for t in timings]


def render(kind: str, **options) -> str:
    out = io.StringIO()
    printer = make_printer(kind, out, **options)
    printer.begin()
    for record in records():
        printer.row(record)
    printer.end(BUILD)
    return out.getvalue()


def test_markdown_layout():
    lines = render("md").splitlines()
    assert lines[0] == (
        "| model                          |       size |     params | backend    | threads "
        "|            test |                  t/s |"
    )
    assert lines[1] == (
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: "
        "| --------------: | -------------------: |"
    )
    # 512 t/s and 500 t/s: mean 506.00, stddev 8.49 (|512 - 500| / sqrt(2)).
    assert lines[2] == (
        "| llama 135M Q4_1                |  92.10 MiB |   134.52 M | CPU        |       2 "
        "|           pp512 |        506.00 ± 8.49 |"
    )
    # 32, 64, 32 t/s: mean 42.67, sample stddev 18.48.
    assert lines[3].endswith("|   tg128 @ d4096 |        42.67 ± 18.48 |")
    assert lines[-1] == "build: gufo 0.1.0 (abc1234)"


def test_markdown_shows_non_default_batch_columns():
    header = render("md", show_batch=True, show_ubatch=True).splitlines()[0]
    assert "| n_batch | n_ubatch |" in header


def test_json_and_jsonl_fields():
    rows = json.loads(render("json"))
    assert rows == [json.loads(line) for line in render("jsonl").splitlines()]
    first = rows[0]
    for field in (
        "build_commit", "cpu_info", "backends", "model_filename", "model_type", "model_size",
        "model_n_params",
        "n_batch", "n_ubatch", "n_threads", "n_prompt", "n_gen", "n_depth", "test_time",
        "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts",
        "device", "device_name", "routes", "torch_version", "triton_version", "machine_fingerprint",
    ):  # fmt: skip
        assert field in first, field
    assert (first["n_prompt"], first["n_gen"], first["n_depth"]) == (512, 0, 0)
    assert first["samples_ts"] == [512.0, 500.0] and first["avg_ts"] == 506.0
    assert rows[1]["stddev_ts"] == pytest.approx(
        math.sqrt(((32 - 128 / 3) ** 2 * 2 + (64 - 128 / 3) ** 2) / 2)
    )


def test_csv_has_a_header_and_one_line_per_row():
    table = list(csv.DictReader(io.StringIO(render("csv"))))
    assert len(table) == 2
    assert table[0]["avg_ts"] == "506.0" and table[0]["samples_ts"] == "512.0;500.0"
    assert table[1]["n_depth"] == "4096" and table[0]["routes"] == "linear.Q4_1=cpu:cpu-int8-avx2"


def test_cache_type_names_follow_llama_bench():
    """type_k / type_v name the KV cache's element type as llama-bench does (its default f16 cache is
    "f16" in the recorded llama-bench JSON fixture)."""
    fixture = json.loads((Path(__file__).parent / "fixtures" / "llamabench_a.json").read_text())
    assert {row["type_k"] for row in fixture} == {"f16"}
    assert cache_type_name(KVCache(1, 1, 1, 4, 8, 8, dtype=torch.float16)) == fixture[0]["type_k"]
    assert cache_type_name(KVCache(1, 1, 1, 4, 8, 8)) == "f32"  # the CPU engine's cache

"""Real `gufo bench` runs on SmolLM2: statistics consistent with the samples, formats, errors."""

from __future__ import annotations

import json
import statistics

import pytest

from gufo.engine.engine import Engine
from gufo.options import DEFAULT_DELTA_RULE_PREFILL
from tests.conftest import gufo


def test_json_rows_statistics_follow_the_samples(capsys):
    code, out, _ = gufo(capsys, "bench", "-m", "smollm2-135m", "-p", "32", "-n", "8", "-d", "0,64", "-r", "2",
                        "-o", "json")  # fmt: skip
    assert code == 0
    rows = json.loads(out)
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [
        (32, 0, 0),
        (0, 8, 0),
        (32, 0, 64),
        (0, 8, 64),
    ]
    for row in rows:
        assert len(row["samples_ns"]) == len(row["samples_ts"]) == 2
        tokens = row["n_prompt"] + row["n_gen"]
        for ns, ts in zip(row["samples_ns"], row["samples_ts"], strict=True):
            assert ts == pytest.approx(tokens * 1e9 / ns, rel=1e-6)
        assert row["avg_ts"] == pytest.approx(statistics.fmean(row["samples_ts"]), rel=1e-6)
        assert row["stddev_ts"] == pytest.approx(statistics.stdev(row["samples_ts"]), rel=1e-5, abs=1e-6)
        assert row["avg_ns"] == pytest.approx(statistics.fmean(row["samples_ns"]), abs=1)
        assert row["model_filename"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
        assert row["backends"] == "CPU" and row["routes"] and row["machine_fingerprint"]
        assert "/" not in row["model_filename"]


def test_markdown_header_and_test_names(capsys):
    code, out, _ = gufo(capsys, "bench", "-m", "smollm2-135m", "-p", "32", "-n", "8", "-d", "0,64", "-r", "2",
                        "-pg", "16,4", "-t", "2")  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "model", "size", "params", "backend", "threads", "test", "t/s"
    ]  # fmt: skip
    tests = [line.split("|")[6].strip() for line in lines[2:] if line.startswith("| llama")]
    assert tests == ["pp32", "tg8", "pp16+tg4", "pp32 @ d64", "tg8 @ d64", "pp16+tg4 @ d64"]
    assert lines[-1].startswith("build: gufo ")


def test_depth_restore_reproduces_a_fresh_prefill():
    """After other work clobbered the slot, a restored depth snapshot decodes like the original prefix."""
    engine = Engine("smollm2-135m", context=128)
    prefix, other = list(range(100, 140)), list(range(500, 560))
    engine.prefill(prefix)
    expected = engine.decode(7, len(prefix))
    snapshot = engine.cache.snapshot(0, len(prefix))
    engine.prefill(other)  # overwrites positions 0..59
    engine.cache.restore(snapshot)
    assert engine.decode(7, len(prefix)).equal(expected)


def test_run_failure_exits_1_and_closes_the_json(capsys, monkeypatch):
    calls = {"n": 0}
    original = Engine.decode

    def failing_decode(self, token, position, slot=0):
        calls["n"] += 1
        if calls["n"] > 1:  # the warm-up step passes, the first timed step fails
            raise RuntimeError("device lost")
        return original(self, token, position, slot)

    monkeypatch.setattr(Engine, "decode", failing_decode)
    code, out, err = gufo(
        capsys, "bench", "-m", "smollm2-135m", "-p", "16", "-n", "2", "-r", "1", "-o", "json"
    )
    assert code == 1
    assert "benchmark failed: RuntimeError: device lost" in err
    rows = json.loads(out)  # still a valid document
    assert [r["n_prompt"] for r in rows] == [16]


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["-p", "32x"], "-p: "),
        (["-n", "8,"], "-n: "),
        (["-d", ",32"], "-d: "),
        (["-p", "-1"], "-p"),
        (["-p", ""], "-p: "),
        (["-r", "0"], "-r/--repetitions"),
        (["-p", "0", "-n", "0"], "nothing to run"),
        (["-m", "no-such-model"], "no-such-model"),
        (["-d", "8192", "-p", "512", "-n", "0"], "context"),
        (["-pg", "512"], "-pg: "),
        (["-t", "0"], "-t: "),
        (["--validate-prefill", "1"], "--validate-prefill"),
        (["-o", "xml"], "-o/--output"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(capsys, args, fragment):
    try:
        code, _, err = gufo(capsys, "bench", "-m", "smollm2-135m", *args)
    except SystemExit as stop:  # argparse's own checks (-r, -o) exit from inside the parser
        code, err = stop.code, capsys.readouterr().err
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_rows_carry_the_run_options_from_flags_and_environment(capsys, monkeypatch):
    """Each row records the options it ran with: the flags, the environment standing in for a kernel flag
    not given; a bad environment value is one error line, exit 2."""
    monkeypatch.setenv("GUFO_INT8_MIN_WEIGHTS", "4096")
    code, out, _ = gufo(capsys, "bench", "-m", "smollm2-135m", "-p", "0", "-n", "2", "-r", "1",
                        "--dependent-launch", "off", "--eager", "-o", "json")  # fmt: skip
    assert code == 0
    (row,) = json.loads(out)
    assert row["options"] == {
        "device": "cpu", "graphs": False, "threads": None, "mmap": True, "int8_min_weights": 4096,
        "dependent_launch": False, "row_products": "vector", "prefill_products": "cublas",
        "delta_rule_prefill": DEFAULT_DELTA_RULE_PREFILL,
    }  # fmt: skip
    code, out, _ = gufo(capsys, "bench", "-m", "smollm2-135m", "-p", "0", "-n", "2", "-r", "1",
                        "--int8-min-weights", "0", "--row-products", "tensor", "--prefill-products", "tiles",
                        "--delta-rule-prefill", "torch", "-o", "json")  # fmt: skip
    assert code == 0
    (row,) = json.loads(out)
    keys = ("int8_min_weights", "dependent_launch", "row_products", "prefill_products", "delta_rule_prefill")
    assert [row["options"][key] for key in keys] == [0, True, "tensor", "tiles", "torch"]
    monkeypatch.setenv("GUFO_INT8_MIN_WEIGHTS", "lots")
    code, out, err = gufo(capsys, "bench", "-m", "smollm2-135m", "-p", "0", "-n", "2", "-r", "1")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "gufo: error: GUFO_INT8_MIN_WEIGHTS='lots': expected a whole number of weights (0: int8 activations "
        "for every matrix of the formats that have int8 kernels)"
    ]

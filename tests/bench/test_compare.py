"""gufo compare on llama-bench JSON (hand-written fixtures in its field layout) and gufo's own rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gufo.cli.main import main
from gufo.tools.bench.compare import Measurement, change, compare_runs
from gufo.tools.bench.report import make_record
from gufo.tools.bench.runner import Timing
from gufo.tools.bench.workload import BenchTest
from tests.bench.test_report import BUILD, RUN

FIXTURES = Path(__file__).parent / "fixtures"
LLAMA_A, LLAMA_B = FIXTURES / "llamabench_a.json", FIXTURES / "llamabench_b.json"


def gufo_run(path: Path) -> Path:
    """A gufo JSONL run on the same file: pp512 at 88/90/92 t/s, tg128 at 40/50/60 t/s."""
    model = {"model_filename": "SmolLM2-135M-Instruct.Q4_1.gguf", "model_type": "llama 135M Q4_1",
             "model_size": 96576768, "model_n_params": 134515008}  # fmt: skip
    timings = [
        Timing(BenchTest(512, 0), [round(512e9 / ts) for ts in (88, 90, 92)]),
        Timing(BenchTest(0, 128), [round(128e9 / ts) for ts in (40, 50, 60)]),
    ]
    path.write_text("".join(json.dumps(make_record(BUILD, model, RUN, t)) + "\n" for t in timings))
    return path


def test_noise_rule_is_the_combined_standard_error():
    base = Measurement(100.0, 2.0, 4)  # standard error 1
    assert change(base, Measurement(101.4, 2.0, 4)).within_noise  # 1.4 < sqrt(1 + 1)
    assert not change(base, Measurement(101.5, 2.0, 4)).within_noise  # 1.5 > sqrt(2)
    assert not change(base, Measurement(101.5, 0.0, 1)).within_noise  # 1.5 > 1
    assert change(base, Measurement(90.0, 2.0, 4)).percent == pytest.approx(-10.0)
    assert not change(Measurement(5.0, 0.0, 1), Measurement(5.1, 0.0, 1)).within_noise


def test_joined_table_with_percentages(tmp_path, capsys):
    gufo = gufo_run(tmp_path / "gufo.jsonl")
    code = main(["compare", str(LLAMA_A), str(LLAMA_B), str(gufo), "--labels", "A,B,G"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "| test | A | B | B vs A | G | G vs A |"
    # A pp512: 98..102 (mean 100, sd 1.58); B: 108..112 -> +10% (diff 10 >> SE 1.0); G: 90 -> -10%.
    assert out[2] == "| pp512 | 100.00 ± 1.58 | 110.00 ± 1.58 | +10.00% | 90.00 ± 2.00 | -10.00% |"
    # tg128: A mean 50 (sd 3.81), B 51 -> +2% within SE 2.41; G 40/50/60 -> +0.00%, noise.
    assert (
        out[3] == "| tg128 | 50.00 ± 3.81 | 51.00 ± 3.81 | +2.00% (noise) | 50.00 ± 10.00 | +0.00% (noise) |"
    )
    assert out[4] == "| pp512 @ d1024 | 80.00 ± 0.00 | — | — | — | — |"


def test_control_run_that_drifts_is_reported(tmp_path, capsys):
    code = main(["compare", str(LLAMA_A), str(LLAMA_B), "--labels", "A,D", "--control", "D"])
    err = capsys.readouterr().err.splitlines()
    assert code == 0
    assert err == [
        "warning: control D differs from A on pp512 by +10.00%, beyond noise: the machine or setup drifted"
    ]


def test_json_output(tmp_path, capsys):
    main(["compare", str(LLAMA_A), str(LLAMA_B), "-o", "json"])
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["test"] == "pp512"
    assert rows[0]["changes_vs_base"]["llamabench_b"]["percent"] == pytest.approx(10.0)
    assert rows[1]["changes_vs_base"]["llamabench_b"]["within_noise"] is True
    assert rows[2]["runs"]["llamabench_b"] is None


@pytest.mark.parametrize(
    "setup,fragment",
    [
        (lambda d: ["compare", str(LLAMA_A)], "at least two runs"),
        (lambda d: ["compare", str(LLAMA_A), str(d / "missing.json")], "missing.json: cannot read"),
        (lambda d: ["compare", str(LLAMA_A), str(LLAMA_B), "--labels", "A"], "--labels"),
        (lambda d: ["compare", str(LLAMA_A), str(LLAMA_B), "--control", "X"], "--control"),
        (lambda d: ["compare", str(LLAMA_A), str(write(d / "bad.json", "{not json"))], "not JSON"),
        (lambda d: ["compare", str(LLAMA_A), str(write(d / "row.json", '[{"n_gen": 1}]'))], "lacks"),
    ],
)
def test_bad_input(tmp_path, capsys, setup, fragment):
    code = main(setup(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_duplicate_rows_in_one_run_are_refused(tmp_path):
    rows = json.loads(LLAMA_A.read_text())
    twice = write(tmp_path / "twice.json", json.dumps(rows + rows[:1]))
    with pytest.raises(Exception, match="two rows"):
        compare_runs([twice, LLAMA_B])

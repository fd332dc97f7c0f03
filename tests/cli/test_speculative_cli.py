"""Speculative decoding through the CLI: `gufo parity` (acceptance 1), run --verbose, bench rows, errors."""

from __future__ import annotations

import json
import re

import pytest

from gufo.kernels.decode import CpuDecodeLayer
from tests.conftest import gufo

pytestmark = pytest.mark.skipif(not CpuDecodeLayer.available(), reason="needs AVX2 and a C compiler")

GEMMA = "gemma3-270m"
SUMMARY = re.compile(r"\[Parity Summary\] prompts=(\d+) mismatches=(\d+) .* acceptance=([0-9.]+)")


def parity_summary(out: str) -> tuple[int, int, float]:
    match = SUMMARY.search(out)
    assert match, out
    return int(match[1]), int(match[2]), float(match[3])


def test_shipped_corpus_is_half_repetitive():
    from gufo.tools.quality.parity import load_corpus

    corpus = load_corpus()
    assert len(corpus) >= 20
    assert sum(p.repetitive for p in corpus) >= len(corpus) / 2


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_parity_ngram_on_the_shipped_corpus(capsys, model):
    code, out, err = gufo(capsys, "parity", "-m", model, "--speculative", "ngram", "-n", "12", "--ignore-eos")
    assert code == 0, err
    prompts, mismatches, acceptance = parity_summary(out)
    assert prompts >= 20 and mismatches == 0 and acceptance > 0
    assert out.count("[Parity] ") == prompts and "MISMATCH" not in out


def test_parity_draft_model_with_a_synthetic_pair(capsys, tmp_path):
    """A 1-layer and a 3-layer random qwen3 sharing the seed (so the same embeddings and first layer)
    and the vocabulary."""
    small, large = tmp_path / "small.gguf", tmp_path / "large.gguf"
    for path, layers in ((small, "1"), (large, "3")):
        code, _, err = gufo(
            capsys, "synth", "--preset", "0.6b", "--layers", layers, "--qtype", "Q8_0", "-o", str(path)
        )
        assert code == 0, err
    code, out, err = gufo(
        capsys,
        "parity",
        "-m",
        str(large),
        "--speculative",
        "draft",
        "--draft-model",
        str(small),
        "--draft-max",
        "3",
        "-n",
        "10",
        "--ignore-eos",
    )
    assert code == 0, err
    prompts, mismatches, acceptance = parity_summary(out)
    assert prompts >= 20 and mismatches == 0 and acceptance > 0


def test_run_verbose_prints_speculative_stats_and_the_plain_trace(capsys):
    prompt = "one two three four, one two three four, one two three four, one two"
    common = ["run", "-m", "smollm2-135m", "-p", prompt, "-n", "24", "--temp", "0", "--verbose"]
    code, plain_out, plain_err = gufo(capsys, *common)
    assert code == 0, plain_err
    code, out, err = gufo(capsys, *common, "--speculative", "ngram", "--draft-max", "4")
    assert code == 0, err
    trace = re.compile(r"\[TokenTrace\]: count=\d+ sha256=[0-9a-f]{64}")
    assert trace.search(err)[0] == trace.search(plain_err)[0] and out == plain_out
    stats = re.search(
        r"\[Speculative\]: drafted=(\d+) accepted=(\d+) acceptance=(\d+)/(\d+) steps=(\d+)", err
    )
    assert stats and int(stats[2]) > 0 and stats[3] == stats[2] and stats[4] == stats[1]


def test_bench_adds_speculative_rows_with_acceptance(capsys):
    code, out, err = gufo(
        capsys,
        "bench",
        "-m",
        "smollm2-135m",
        "-p",
        "0",
        "-n",
        "16",
        "-r",
        "1",
        "--speculative",
        "ngram",
        "-o",
        "json",
    )
    assert code == 0, err
    rows = {row["test"]: row for row in json.loads(out)}
    assert set(rows) == {"tg16", "tg16-ngram"}
    spec = rows["tg16-ngram"]["speculative"]
    assert spec["mode"] == "ngram" and spec["drafted"] > 0 and 0 <= spec["acceptance"] <= 1
    assert rows["tg16-ngram"]["n_gen"] == 16 and rows["tg16-ngram"]["avg_ts"] > 0
    assert "speculative" not in rows["tg16"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["run", "-p", "x", "--speculative", "draft"], "--draft-model"),
        (["run", "-p", "x", "--draft-model", "smollm2-135m"], "--draft-model needs --speculative draft"),
        (["run", "-p", "x", "--speculative", "ngram", "--draft-min", "9", "--draft-max", "4"], "--draft-min"),
        (
            ["run", "-m", "smollm2-135m", "-p", "x", "--speculative", "draft", "--draft-model", GEMMA],
            "vocabulary differs",
        ),
        (["parity", "--speculative", "ngram", "--corpus", "missing.jsonl"], "--corpus"),
    ],
)
def test_bad_speculative_input_is_one_line_exit_2(capsys, args, message):
    code, _, err = gufo(capsys, *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_malformed_corpus_line_is_named(capsys, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "prompt": "x"}\n{"prompt": 3\n')
    code, _, err = gufo(capsys, "parity", "--speculative", "ngram", "--corpus", str(corpus))
    assert code == 2 and "line 2" in err

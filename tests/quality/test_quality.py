"""`gufo quality` (acceptance 4): against llama.cpp's final logits, against itself, and a perturbed route."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gufo.cli.common import NOISE_ENV
from gufo.cli.main import main
from gufo.quality.reference import ReferenceLogits
from gufo.runtime.engine import Engine
from tests.conftest import GOLDENS, MODELS, gufo

TEXT = (
    "The quick brown fox jumps over the lazy dog. " * 6
    + "Then it ran into the forest and was never seen again."
)


def numpy_kl(reference: np.ndarray, candidate: np.ndarray) -> float:
    """KL(reference || candidate) of two logit vectors, written independently of gufo.quality."""
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    log_p = ref - ref.max() - np.log(np.exp(ref - ref.max()).sum())
    log_q = cand - cand.max() - np.log(np.exp(cand - cand.max()).sum())
    return float((np.exp(log_p) * (log_p - log_q)).sum())


def quality_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("alias", sorted(MODELS))
def test_kl_against_llama_cpp_final_logits_matches_numpy(capsys, tmp_path, alias, shared_dir):
    prompt = json.loads((GOLDENS / f"{MODELS[alias]}-logits.json").read_text())["prompts"][0]
    assert prompt["id"] == "code_py"
    golden = np.load(GOLDENS / f"{MODELS[alias]}-final-logits-code_py.npy")
    ids = np.array(prompt["prompt_ids"])
    gufo_logits = Engine(alias).prefill(prompt["prompt_ids"]).numpy()
    expected = numpy_kl(golden, gufo_logits)
    for top_k in (0, 256):
        path = tmp_path / f"golden-{top_k}.npz"
        rows = torch.from_numpy(golden)[None]
        ReferenceLogits.from_rows(ids, len(ids), np.array([len(ids) - 1]), rows, top_k).save(path)
        code, out, err = gufo(capsys, "quality", "-m", alias, "--reference", str(path), "--json")
        assert code == 0, err
        report = quality_json(out)
        assert report["positions"] == 1 and report["top1_agreement"] == 1.0
        if top_k == 0:  # full rows: the same number as numpy's
            assert report["full_vocabulary"] and report["kl_mean"] == pytest.approx(
                expected, rel=1e-6, abs=1e-12
            )
        else:  # top-K + rest: a lower bound, close when the top-K holds most of the mass
            assert expected * 0.5 <= report["kl_mean"] <= expected + 1e-12
    assert 0 < expected < 0.05  # gufo's CPU route is close to llama.cpp's


@pytest.fixture(scope="module")
def saved_reference(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("quality")
    text = folder / "corpus.txt"
    text.write_text(TEXT)
    path = folder / "ref.npz"
    args = ["quality", "-m", "smollm2-135m", "-f", str(text), "--chunk", "32", "--save-logits", str(path)]
    assert main(args) == 0
    return str(path)


def test_gufo_against_itself_is_kl_zero_and_top1_100(capsys, saved_reference):
    gates = ["--max-kl", "0", "--min-top1", "100", "--json"]
    code, out, err = gufo(capsys, "quality", "-m", "smollm2-135m", "--reference", saved_reference, *gates)
    assert code == 0, err
    report = quality_json(out)
    assert report["kl_max"] == 0.0 and report["top1_agreement"] == 1.0 and report["nonfinite_candidate"] == 0
    assert report["positions"] > 32 and report["reference_ppl"] == report["candidate_ppl"]
    assert not report["full_vocabulary"]  # 49152 tokens: top-256 + log-sum-exp by default


def test_a_perturbed_route_is_flagged_by_the_gate(capsys, monkeypatch, saved_reference):
    monkeypatch.setenv(NOISE_ENV, "3:0.5")
    gates = ["--max-kl", "0.005", "--min-top1", "99"]
    code, out, err = gufo(capsys, "quality", "-m", "smollm2-135m", "--reference", saved_reference, *gates)
    assert code == 1
    assert "quality gate failed: mean KL" in err and len(err.strip().splitlines()) == 1
    assert "[Quality] positions=" in out


def test_token_corpus_with_full_rows(capsys, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("1, 504, 2365, 7509\n 30, 504 2365 7509 30\n")
    ref = tmp_path / "ref.npz"
    args = ["quality", "-m", "smollm2-135m", "--top-k", "0"]
    code, out, err = gufo(capsys, *args, "--tokens", str(ids), "--save-logits", str(ref))
    assert code == 0, err
    assert "9 positions (full vocabulary)" in out
    code, out, err = gufo(capsys, "quality", "-m", "smollm2-135m", "--reference", str(ref), "--json")
    assert code == 0 and quality_json(out)["kl_max"] == 0.0 and quality_json(out)["full_vocabulary"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--reference", "missing.npz"], "--reference missing.npz: cannot read"),
        (["--save-logits", "out.npz"], "needs a corpus"),
        (["--reference", "corpus.txt"], "not a gufo reference logits file"),
        (
            ["--save-logits", "out.npz", "--tokens", "corpus.txt"],
            "--tokens: expected comma-separated token ids",
        ),
        (["--save-logits", "out.npz", "-f", "corpus.txt", "--max-kl", "1"], "gate a --reference"),
    ],
)
def test_bad_quality_input_is_one_line_exit_2(capsys, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("hello there")
    code, _, err = gufo(capsys, "quality", "-m", "smollm2-135m", *args)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err

"""`gufo quality` (acceptance 4): against llama.cpp's final logits, against itself, and a perturbed route."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gufo.cli.common import NOISE_ENV
from gufo.cli.main import main
from gufo.engine.engine import Engine
from gufo.tools.quality.reference import ReferenceLogits, log_sum_exp
from tests.conftest import GOLDENS, MODELS, gufo

TEXT = (
    "The quick brown fox jumps over the lazy dog. " * 6
    + "Then it ran into the forest and was never seen again."
)


def numpy_kl(reference: np.ndarray, candidate: np.ndarray) -> float:
    """KL(reference || candidate) of two logit vectors, written independently of gufo.tools.quality."""
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


def record(folder, chunk: int, *flags: str) -> str:
    """`gufo quality --save-logits` over TEXT (72 tokens with BOS) in chunks of `chunk`."""
    text = folder / "corpus.txt"
    text.write_text(TEXT)
    path = folder / f"ref-{chunk}{''.join(flags)}.npz"
    args = ["quality", "-m", "smollm2-135m", "-f", str(text), "--chunk", str(chunk), *flags]
    assert main([*args, "--save-logits", str(path)]) == 0
    return str(path)


@pytest.fixture(scope="module")
def saved_reference(tmp_path_factory) -> str:
    return record(tmp_path_factory.mktemp("quality"), 32)


def numpy_perplexity(chunk: int) -> float:
    """exp(-mean log p(next token)) of TEXT in chunks of `chunk`, from the engine's logit rows with numpy's
    float64 log-softmax (not gufo.tools.quality's code)."""
    engine = Engine("smollm2-135m")
    tokens = engine.tokenizer.encode(TEXT, add_special=True)
    logp = []
    for start in range(0, len(tokens), chunk):
        part = tokens[start : start + chunk]
        rows = engine.prefill(part, all_logits=True).double().numpy()
        top = rows.max(-1, keepdims=True)
        log_softmax = rows - top - np.log(np.exp(rows - top).sum(-1, keepdims=True))
        logp += [log_softmax[i, part[i + 1]] for i in range(len(part) - 1)]
    return float(np.exp(-np.mean(logp)))


# chunk 32: 32 + 32 + 8 rows; chunk 71: a 1-row tail, whose log-sum-exp torch's reduction (2 threads)
# split across threads while the same row among many was summed on one: KL and perplexity then differed
# from the recording in the last bits. -t 1 is the thread count the tensor-parallel tests left behind.
@pytest.mark.parametrize("chunk,threads", [(32, None), (32, "1"), (71, "2")])
def test_gufo_against_itself_is_kl_zero_and_top1_100(capsys, tmp_path, saved_reference, chunk, threads):
    flags = ("-t", threads) if threads else ()
    reference = record(tmp_path, chunk, *flags) if flags or chunk != 32 else saved_reference
    gates = ["--max-kl", "0", "--min-top1", "100", "--json"]
    code, out, err = gufo(capsys, "quality", "-m", "smollm2-135m", "--reference", reference, *flags, *gates)
    assert code == 0, err
    report = quality_json(out)
    assert report["kl_max"] == 0.0 and report["top1_agreement"] == 1.0 and report["nonfinite_candidate"] == 0
    assert report["positions"] == 72 and report["reference_ppl"] == report["candidate_ppl"]
    assert not report["full_vocabulary"]  # 49152 tokens: top-256 + log-sum-exp by default
    # and the number itself: float64 log-softmax over 49152 terms is good to ~1e-14 per position (pairwise
    # sums, relative error <= log2(49152) * 2**-53 ~ 2e-15, times |logits| < 100), so the mean of 70
    # log-probabilities and its exp agree with numpy's far inside 1e-12 relative
    assert report["reference_ppl"] == pytest.approx(numpy_perplexity(chunk), rel=1e-12)


def test_log_sum_exp_is_the_same_bits_alone_or_among_many_rows_and_threads():
    """The reference's and the candidate's log-sum-exp: a row alone (a chunk's tail) and the same row
    among many give the same bits on 1 and 2 threads, and match math.fsum's correctly rounded sum."""
    rows = torch.from_numpy(np.random.default_rng(5).normal(0, 4, (9, 49152)).astype(np.float32))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(log_sum_exp(rows))
            results.append(torch.cat([log_sum_exp(rows[i : i + 1]) for i in range(len(rows))]))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(results[0], other) for other in results[1:])
    for row, lse in zip(rows.double().tolist(), results[0].tolist(), strict=True):
        top = max(row)
        exact = top + math.log(math.fsum(math.exp(x - top) for x in row))
        # each exp is within 1 ulp and numpy's pairwise sum within log2(49152) * 2**-53 relative (the
        # same on fsum's side but the sum), so the log moves by <= ~20 * 2**-53; plus the rounding of
        # top + log(sum) near 20 (ulp 3.6e-15): under 1e-14 in all, inside 1e-13
        assert abs(lse - exact) <= 1e-13
    infinite = torch.tensor([[-math.inf, -math.inf], [math.inf, 0.0]])
    assert log_sum_exp(infinite).tolist() == [-math.inf, math.inf]


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

"""--validate-prefill on both real models, and proof that it fails when the batched path is perturbed."""

from __future__ import annotations

import json

import pytest
import torch

from gufo.tools.quality.logit_diff import compare_logits
from tests.conftest import MODELS, gufo


@pytest.mark.parametrize("alias", sorted(MODELS))
def test_validate_prefill_passes_on_real_models(capsys, alias):
    code, out, err = gufo(capsys, "bench", "-m", alias, "--validate-prefill", "64", "-p", "0", "-n", "0")
    assert code == 0 and out == ""
    first, second = err.strip().splitlines()
    assert first.startswith("[Prefill Validation] tokens=64 sequential_top1=")
    assert first.endswith("top1_match=yes finite=yes")
    assert second.startswith("[Prefill Validation] max_abs_diff=") and " cosine=" in second


def test_uneven_chunks_and_json_record(capsys):
    # 64 tokens in physical batches of 24: chunks 24 + 24 + 16.
    code, out, err = gufo(capsys, "bench", "-m", "smollm2-135m", "--validate-prefill", "64", "-ub", "24",
                          "-p", "16", "-n", "0", "-r", "1", "-o", "json")  # fmt: skip
    assert code == 0 and "top1_match=yes" in err
    record = json.loads(out)[0]["prefill_validation"]
    assert record["tokens"] == 64 and record["passed"] and record["finite"]
    assert record["cosine"] > 0.999


def test_noise_in_one_prefill_layer_fails_with_exit_1_before_any_table(capsys, monkeypatch):
    monkeypatch.setenv("GUFO_DEBUG_PREFILL_NOISE", "3:50")
    code, out, err = gufo(
        capsys, "bench", "-m", "smollm2-135m", "--validate-prefill", "64", "-p", "16", "-n", "4"
    )
    assert code == 1
    assert out == ""  # no table
    assert "top1_match=no" in err and "prefill validation failed" in err
    margin = float(err.split("sequential_margin=")[1].split()[0])  # the report's own number, in the error
    assert f"leads its runner-up by {margin:.3g})" in err


def test_metrics_by_hand():
    reference = torch.tensor([1.0, 2.0, 3.0, 4.0])
    candidate = torch.tensor([1.0, 2.0, 3.0, 2.0])
    diff = compare_logits(reference, candidate)
    assert diff.max_abs_diff == 2.0 and diff.mean_abs_diff == 0.5 and diff.rmse == 1.0
    assert diff.cosine == pytest.approx(22 / (30**0.5 * 18**0.5))
    assert (diff.reference_top1, diff.candidate_top1, diff.top1_match, diff.finite) == (3, 2, False, True)
    assert diff.reference_margin == 1.0  # 4 - 3
    assert compare_logits(torch.tensor([0.5, 2.25, 2.0]), candidate[:3]).reference_margin == 0.25
    assert not compare_logits(reference, torch.tensor([1.0, float("nan"), 0.0, 0.0])).finite

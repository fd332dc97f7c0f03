"""The CLI against llama.cpp's goldens: tokenize, logits, run (token trace), and its error contract."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import GOLDENS, HANG_GUARD_S, MODELS, golden, gufo


@pytest.mark.parametrize("alias", sorted(MODELS))
def test_tokenize_reproduces_llamacpp_prompt_ids(capsys, alias):
    for prompt in golden(alias)["prompts"]:
        code, out, _ = gufo(capsys, "tokenize", "-m", alias, "-p", prompt["prompt"], "--ids")
        assert code == 0
        assert json.loads(out) == prompt["prompt_ids"], prompt["id"]


@pytest.mark.parametrize("alias", sorted(MODELS))
def test_logits_top1_matches_llamacpp_last_positions(capsys, tmp_path, alias):
    reference = json.loads((GOLDENS / f"{MODELS[alias]}-logits.json").read_text())["prompts"][0]
    ids = ",".join(str(i) for i in reference["prompt_ids"])
    npy = tmp_path / "last.npy"
    code, out, _ = gufo(
        capsys,
        "logits",
        "-m",
        alias,
        "--ids",
        ids,
        "--positions",
        "all",
        "--top",
        "5",
        "--npy",
        str(npy),
        "-c",
        "512",
    )
    assert code == 0
    result = json.loads(out)
    assert result["tokens"] == reference["prompt_ids"]
    ours = {p["position"]: p["top"] for p in result["positions"]}
    for entry in reference["positions"]:
        position, ids_top, logits_top = entry["pos"], entry["top20_ids"], entry["top20_logits"]
        assert reference["prompt_ids"][position] == entry["input_token_id"]  # same position convention
        if logits_top[0] - logits_top[1] >= 1.0:
            assert ours[position][0][0] == ids_top[0], position
    full = np.load(npy)
    golden_full = np.load(GOLDENS / f"{MODELS[alias]}-final-logits-code_py.npy")
    assert full.dtype == np.float32 and full.shape == golden_full.shape
    assert int(full.argmax()) == int(golden_full.argmax())


def trace_of(ids: list[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


@pytest.mark.parametrize("alias", sorted(MODELS))
def test_run_greedy_prefix_and_token_trace(capsys, alias):
    def robust_prefix(prompt: dict) -> int:  # llama.cpp's greedy path is unambiguous up to here
        margins = prompt["greedy_top1_minus_top2"]
        return next((i for i, m in enumerate(margins) if m < 0.5), len(margins))

    prompt = max(golden(alias)["prompts"], key=robust_prefix)
    robust = robust_prefix(prompt)
    assert robust >= 2
    code, out, err = gufo(
        capsys,
        "run",
        "-m",
        alias,
        "-p",
        prompt["prompt"],
        "-n",
        str(robust),
        "--temp",
        "0",
        "--ignore-eos",
        "--verbose",
        "-c",
        "256",
    )
    assert code == 0
    expected_ids = prompt["greedy_ids"][:robust]
    assert f"[TokenTrace]: count={robust} sha256={trace_of(expected_ids)}" in err
    assert "tok/s" in err
    assert "[Routes]: " in err and "rms_norm=" in err


def test_prompt_longer_than_context_is_bad_input(capsys):
    code, _, err = gufo(capsys, "run", "-m", "smollm2-135m", "-p", "word " * 300, "-c", "64", "-n", "4")
    assert code == 2
    assert "context size 64" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["run", "-m", "no-such-model", "-p", "x"], "no-such-model"),
        (["logits", "-m", "smollm2-135m", "--ids", "1,x"], "--ids"),
        (["logits", "-m", "smollm2-135m", "--ids", "99999999"], "outside the vocabulary"),
        (["run", "-m", "smollm2-135m", "-p", "x", "--temp", "-1"], "--temp"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(capsys, args, fragment):
    code, _, err = gufo(capsys, *args)
    assert code == 2
    assert fragment in err and len(err.strip().splitlines()) == 1


def test_bad_flag_is_usage_error():
    proc = subprocess.run(
        [sys.executable, "-m", "gufo.cli.main", "run", "-p", "x", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == ["gufo run: error: unknown flag --no-such-flag (see gufo run --help)"]

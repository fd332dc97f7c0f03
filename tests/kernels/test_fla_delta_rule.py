"""The gated delta rule's fla-core prefill route (`gufo.kernels.fla_delta_rule`, KernelOptions.
delta_rule_prefill "fla") against a float64 run of the torch recurrent form on a GPU, and the option's
choices, default and errors on the CPU."""

from __future__ import annotations

import argparse
import types

import pytest
import torch

from gufo import options
from gufo.cli.common import add_eager_flag
from gufo.errors import BadInputError
from gufo.options import KernelOptions

pytest.importorskip("triton")

from gufo.kernels.triton.dependent_launch import DependentLaunch  # noqa: E402  (needs triton)
from gufo.kernels.triton.recurrent import TritonGatedDeltaRule  # noqa: E402

LAUNCH = DependentLaunch(enabled=True)
TOLERANCE = 2e-3  # norm-relative, float32 inputs on tf32 tensor cores (docs/decisions.md)


def fla_found(monkeypatch: pytest.MonkeyPatch, found: bool) -> None:
    spec = types.SimpleNamespace(name="fla") if found else None
    monkeypatch.setattr(options, "find_spec", lambda name: spec)


@pytest.mark.parametrize("found", [True, False], ids=["with-fla", "without-fla"])
def test_default_is_the_recurrent_step_fla_or_not(monkeypatch, found):
    fla_found(monkeypatch, found)
    assert KernelOptions().delta_rule_prefill == "recurrent"
    assert KernelOptions(delta_rule_prefill="torch").delta_rule_prefill == "torch"


def test_fla_requested_without_fla_is_one_error_line(monkeypatch):
    fla_found(monkeypatch, False)
    with pytest.raises(BadInputError) as err:
        KernelOptions(delta_rule_prefill="fla")
    assert str(err.value) == (
        "delta rule prefill fla: fla-core is not installed; pip install 'gufo[cuda]' or pass "
        "--delta-rule-prefill recurrent"
    )


def test_unknown_route_is_refused():
    with pytest.raises(BadInputError, match="expected one of fla, torch, recurrent, got 'triton'"):
        KernelOptions(delta_rule_prefill="triton")


def test_flag_takes_the_routes_only(capsys):
    parser = argparse.ArgumentParser()
    add_eager_flag(parser)
    assert parser.parse_args([]).delta_rule_prefill is None  # KernelOptions' default then
    assert parser.parse_args(["--delta-rule-prefill", "torch"]).delta_rule_prefill == "torch"
    with pytest.raises(SystemExit):
        parser.parse_args(["--delta-rule-prefill", "cuda"])
    assert "invalid choice: 'cuda'" in capsys.readouterr().err


def test_fla_that_does_not_import_is_one_error_line(monkeypatch):
    """The route imports fla at its first prefill: a failed import names itself and the way out."""
    if options.fla_installed():
        pytest.skip("fla-core is installed")
    kernel = TritonGatedDeltaRule(LAUNCH, prefill="fla")
    q = torch.randn(3, 2, 4)
    with pytest.raises(BadInputError) as err:
        kernel.apply(q, q, q, -torch.rand(3, 2), torch.rand(3, 2), torch.zeros(2, 4, 4), 0.5)
    message = str(err.value)
    assert message.startswith("delta rule prefill fla: fla-core does not import (No module named 'fla')")
    assert message.endswith("--delta-rule-prefill recurrent") and "\n" not in message


@pytest.mark.gpu
@pytest.mark.parametrize("n_tokens", [2, 101, 1024])
def test_fla_route_matches_float64_recurrence(n_tokens):
    """Qwen3.5-27B's DeltaNet (16 key heads tiled over 48 value heads of 128 x 128) as the mixer hands
    it over (scripts/delta_rule_bench.py's inputs), through the registered kernel's prefill route (l2norm
    with eps 1e-6, scale 1/sqrt(128)): outputs and final state within TOLERANCE of the float64 recurrent
    form; lengths below, across and over chunks of 64."""
    pytest.importorskip("fla")
    from scripts.delta_rule_bench import EPS, SCALE, exact, inputs, norm_rel

    x = inputs(n_tokens, torch.Generator("cuda").manual_seed(n_tokens))
    want, want_state = exact(x)
    state = x["state"].clone()
    kernel = TritonGatedDeltaRule(LAUNCH, prefill="fla")
    out = kernel.apply(x["q"], x["k"], x["v"], x["g"], x["beta"], state, SCALE, None, EPS)
    assert out.dtype == torch.float32 and out.shape == x["v"].shape
    assert norm_rel(out, want) <= TOLERANCE
    assert norm_rel(state, want_state) <= TOLERANCE

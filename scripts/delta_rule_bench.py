"""The gated delta rule's GPU prefill routes (KernelOptions.delta_rule_prefill) timed on Qwen3.5-27B's
Gated DeltaNet, each checked against a float64 run of the recurrent form.

One layer: 16 key heads of 128 tiled over 48 value heads (the qwen35 model's order), 128 x 128 state per
value head (`gufo synth` preset qwen35 27b). Every route goes through the registered kernel
(`TritonGatedDeltaRule`, as the engine calls it: l2norm with eps 1e-6 and scale 1/sqrt(128) inside) on
the model's input forms (raw q and k, strided v rows, g = -exp(A_log) softplus(a + dt_bias), beta =
sigmoid(b), a carried-in state). Per token count a row: µs of each route (median of
triton.testing.do_bench: fla, torch, and recurrent, the Triton decode step over the tokens in one launch),
`faster` (the fastest of the three), `norm_rel` (|out - exact| / |exact|) of outputs and final states, and
fla's `out_sha256` (two runs with the same digest: fla's prefill is deterministic). Needs a GPU and
fla-core (`pip install 'gufo[cuda]'`):

    python scripts/delta_rule_bench.py --tokens 512 2048 --json delta_rule_bench.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json

import torch
import torch.nn.functional as F
import triton

from gufo.kernels.delta_rule import recurrent_delta_rule, scaled_queries_keys
from gufo.kernels.triton.dependent_launch import DependentLaunch
from gufo.kernels.triton.recurrent import TritonGatedDeltaRule
from gufo.options import DELTA_RULE_PREFILLS

VALUE_HEADS, KEY_HEADS, KEY_DIM, VALUE_DIM = 48, 16, 128, 128  # Qwen3.5-27B linear attention
SCALE, EPS = KEY_DIM**-0.5, 1e-6


def inputs(n_tokens: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """What the mixer hands the op: q and k of the key heads tiled over the value heads, v a view of
    the conv's output (rows strided), decay rates exp(A_log) in [1, 16]."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda")

    per = VALUE_HEADS // KEY_HEADS
    rate = 1 + 15 * torch.rand(VALUE_HEADS, generator=gen, device="cuda")
    return {
        "q": randn(n_tokens, KEY_HEADS, KEY_DIM).repeat(1, per, 1),
        "k": randn(n_tokens, KEY_HEADS, KEY_DIM).repeat(1, per, 1),
        "v": randn(n_tokens, 2 * KEY_HEADS * KEY_DIM + VALUE_HEADS * VALUE_DIM)[
            :, 2 * KEY_HEADS * KEY_DIM :
        ].reshape(n_tokens, VALUE_HEADS, VALUE_DIM),
        "g": -rate * F.softplus(randn(n_tokens, VALUE_HEADS) - 4),
        "beta": torch.sigmoid(randn(n_tokens, VALUE_HEADS)),
        "state": randn(VALUE_HEADS, KEY_DIM, VALUE_DIM) * 0.1,
    }


def exact(x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 recurrent form: outputs and final state."""
    q, k = scaled_queries_keys(x["q"].double(), x["k"].double(), SCALE, EPS)
    state = x["state"].double().clone()
    out = recurrent_delta_rule(q, k, x["v"].double(), x["g"].double(), x["beta"].double(), state)
    return out, state


def norm_rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def kernels() -> dict[str, TritonGatedDeltaRule]:
    """The prefill routes (KernelOptions.delta_rule_prefill): the chunked forms and "recurrent", the
    decode step's arithmetic over the tokens in one launch (bit for bit the decode steps)."""
    launch = DependentLaunch(enabled=True)
    return {route: TritonGatedDeltaRule(launch, prefill=route) for route in DELTA_RULE_PREFILLS}


def measure(
    kernel: TritonGatedDeltaRule, x: dict[str, torch.Tensor], want: torch.Tensor, want_state: torch.Tensor
) -> tuple[dict, torch.Tensor]:
    """The route's row (µs, errors) and its outputs."""
    args = x["q"], x["k"], x["v"], x["g"], x["beta"]
    state = x["state"].clone()
    out = kernel.apply(*args, state, SCALE, None, EPS)
    timed_state = x["state"].clone()  # advanced by every timed call: the first call's result is kept
    ms = triton.testing.do_bench(
        lambda: kernel.apply(*args, timed_state, SCALE, None, EPS), rep=200, return_mode="median"
    )
    row = {
        "us": round(ms * 1000, 1),
        "norm_rel": norm_rel(out, want),
        "state_norm_rel": norm_rel(state, want_state),
    }
    return row, out


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048], help="prefill lengths")
    parser.add_argument("--json", metavar="PATH", help="also write the report here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("delta_rule_bench: needs a CUDA GPU")
    gen = torch.Generator("cuda").manual_seed(0)
    rows = []
    for n_tokens in args.tokens:
        x = inputs(n_tokens, gen)
        want, want_state = exact(x)
        row: dict = {"tokens": n_tokens, "out_sha256": None}
        for route, kernel in kernels().items():
            try:
                row[route], out = measure(kernel, x, want, want_state)
            except Exception as err:  # noqa: BLE001 (report what failed, measure the other routes)
                row[route] = {"error": f"{type(err).__name__}: {err}"[:300]}
                continue
            if route == "fla":
                row["out_sha256"] = hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()
        timed = {route: row[route]["us"] for route in DELTA_RULE_PREFILLS if "us" in row[route]}
        row["faster"] = min(timed, key=timed.get) if len(timed) == len(DELTA_RULE_PREFILLS) else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    report = {
        "device": torch.cuda.get_device_name(),
        "versions": {p: version(p) for p in ("torch", "triton", "fla-core")},
        "shape": {
            "value_heads": VALUE_HEADS,
            "key_heads": KEY_HEADS,
            "key_dim": KEY_DIM,
            "value_dim": VALUE_DIM,
        },
        "rows": rows,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

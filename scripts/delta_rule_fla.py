"""gufo's gated delta rule (torch, `gufo.kernels.delta_rule`) against the `fla-core` Triton kernels.

Issue 9 asks to evaluate `fla-core` (flash-linear-attention) before writing Triton kernels of our own.
On one layer of Qwen3.5-27B's Gated DeltaNet (48 value heads, 16 key heads, 128 x 128 state per value
head) this times the prefill form (chunked, --tokens tokens) and the decode form (one token), both
ours and fla's `chunk_gated_delta_rule` / `fused_recurrent_gated_delta_rule`, and reports each output's
largest difference from a float64 run of our recurrent form. Needs a GPU and `pip install fla-core`:

    python scripts/delta_rule_fla.py --tokens 2048
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

from gufo.kernels.delta_rule import chunked_delta_rule, recurrent_delta_rule

VALUE_HEADS, KEY_HEADS, KEY_DIM, VALUE_DIM = 48, 16, 128, 128  # Qwen3.5-27B linear attention


def inputs(n_tokens: int, gen: torch.Generator, device: str = "cuda") -> dict[str, torch.Tensor]:
    """Random inputs as the model makes them: L2-normalised keys and queries per key head, decay
    g = -exp(A_log) softplus(a + dt_bias) < 0 with exp(A_log) in [1, 16], beta = sigmoid(b), and a
    state carried in from earlier tokens."""

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device)

    decay_rate = 1 + 15 * torch.rand(VALUE_HEADS, generator=gen, device=device)
    return {
        "q": F.normalize(randn(n_tokens, KEY_HEADS, KEY_DIM), dim=-1),
        "k": F.normalize(randn(n_tokens, KEY_HEADS, KEY_DIM), dim=-1),
        "v": randn(n_tokens, VALUE_HEADS, VALUE_DIM),
        "g": -decay_rate * F.softplus(randn(n_tokens, VALUE_HEADS) - 4),
        "beta": torch.sigmoid(randn(n_tokens, VALUE_HEADS)),
        "state": randn(VALUE_HEADS, KEY_DIM, VALUE_DIM) * 0.1,
    }


def ours(
    x: dict[str, torch.Tensor],
    scale: float,
    dtype: torch.dtype = torch.float32,
    form: Callable[..., torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """gufo's forms take q and k per value head (the model repeats key heads first); `form` defaults
    to what the engine runs: recurrent for one token, chunked for more."""
    per = VALUE_HEADS // KEY_HEADS
    q = x["q"].repeat_interleave(per, 1).to(dtype) * scale
    k = x["k"].repeat_interleave(per, 1).to(dtype)
    state = x["state"].to(dtype).clone()
    form = form or (recurrent_delta_rule if x["q"].shape[0] == 1 else chunked_delta_rule)
    out = form(q, k, x["v"].to(dtype), x["g"].to(dtype), x["beta"].to(dtype), state)
    return out, state


def fla(x: dict[str, torch.Tensor], scale: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    form = fused_recurrent_gated_delta_rule if x["q"].shape[0] == 1 else chunk_gated_delta_rule
    out, state = form(
        x["q"][None].to(dtype),
        x["k"][None].to(dtype),
        x["v"][None].to(dtype),
        g=x["g"][None].float(),
        beta=x["beta"][None].to(dtype),
        scale=scale,
        initial_state=x["state"][None].float(),
        output_final_state=True,
    )
    return out[0], state[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="prefill tokens")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    gen = torch.Generator("cuda").manual_seed(0)
    scale = KEY_DIM**-0.5
    rows = []
    for n_tokens in (args.tokens, 1):
        x = inputs(n_tokens, gen)
        exact, exact_state = ours(x, scale, torch.float64, recurrent_delta_rule)
        candidates = {
            "gufo torch float32": lambda x=x: ours(x, scale),
            "fla float32": lambda x=x: fla(x, scale, torch.float32),
            "fla bfloat16": lambda x=x: fla(x, scale, torch.bfloat16),
        }
        for name, run in candidates.items():
            try:
                out, state = run()
                ms = triton.testing.do_bench(run, rep=200, return_mode="median")
            except Exception as err:  # noqa: BLE001 (report what failed and go on)
                rows.append({"tokens": n_tokens, "impl": name, "error": f"{type(err).__name__}: {err}"[:200]})
                print(rows[-1], flush=True)
                continue
            rows.append(
                {
                    "tokens": n_tokens,
                    "impl": name,
                    "ms": round(ms, 4),
                    "max_abs_out": float((out.double() - exact).abs().max()),
                    "max_abs_state": float((state.double() - exact_state).abs().max()),
                }
            )
            print(rows[-1], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

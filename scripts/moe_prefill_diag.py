"""Per mixture-of-experts layer, where a qwen35moe file's decode and batched prefill part ways.

N random tokens (`--validate-prefill`'s) go one at a time through eager decode, then as one batched
prefill; every MoE FFN's input and output is recorded in both passes. One line per MoE layer:

- in: the FFN input's drift, max|prefill - decode| / max|decode| (what the layers before brought);
- flips: tokens whose chosen expert set differs between the two passes (each on its own input);
- out: the same drift of the FFN output;
- same-in: prefill's own input rows through the FFN again, one token at a time (decode's route: the
  experts gathered on the device) against all at once (prefill's: the grouped products), relative
  max diff, and the tokens whose expert sets differ between those two (router rounding alone);
- oracle: on the first --oracle-tokens rows, the plain float32 math of the layer (dequantized router,
  experts and shared expert, written out here) against decode's route and prefill's route.

Reading it: a defect of the expert path shows as `same-in` or `oracle` far above the products'
rounding (int8 activations, float16 prefill operands: ~1e-2 relative) at some layer. Rounding that
routing amplifies shows as small `same-in` and `oracle`, with `in` and `flips` growing layer by layer:
random synth routers spread the softmax over all experts, so the top-k choice is a near-tie that any
rounding difference flips, and a flipped expert replaces 1/k of the routed output. On the CPU, an
8-layer `gufo synth --arch qwen35moe --preset 35b-a3b --layers 8` file (256 tokens): same-in <= 5.1e-7
and oracle 1.1e-2..1.4e-2 (int8 activations) on every layer, while in grew 3.2e-4 -> 1.0e-1 and flips
0, 4, 22, 26, 65, 100, 117, 112; final logits cosine 0.997. With a random router (weights ~0.02: logits
~0.9 standard deviation over 256 experts, the top 8 holding 17% of the probability) a 1e-3 relative
change of the input already changes the expert set of 1% of the tokens, 1e-2 of 10%.

    PYTHONPATH=src python scripts/moe_prefill_diag.py FILE [-n 256] [--device cuda] [--oracle-tokens 4]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from gufo.engine.engine import Engine
from gufo.gguf.model_file import ModelFile, TensorInfo
from gufo.kernels.linear_reference import dequantize_tensor
from gufo.models.moe import MoEFFN
from gufo.options import RunOptions
from gufo.tools.quality.logit_diff import compare_logits
from gufo.tools.quality.validate_prefill import validation_tokens


def recording(ffn: MoEFFN, log: dict[str, list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
    """Make ffn append (input, output) to log[log["mode"]] on every call (log["mode"] None: nothing)."""
    base = type(ffn)

    def call(self, x):
        out = base.__call__(self, x)
        if log["mode"] is not None:
            log[log["mode"]].append((x.float().cpu(), out.float().cpu()))
        return out

    ffn.__class__ = type(f"Recorded{base.__name__}", (base,), {"__call__": call})


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def chosen_sets(ffn: MoEFFN, x: torch.Tensor, per_token: bool) -> list[frozenset[int]]:
    rows = [x[t : t + 1] for t in range(x.shape[0])] if per_token else [x]
    ids = torch.cat([ffn.router(r).float().topk(ffn.shape.n_used, dim=-1).indices.cpu() for r in rows])
    return [frozenset(row.tolist()) for row in ids]


def flips(ffn: MoEFFN, x_decode: torch.Tensor, x_prefill: torch.Tensor) -> int:
    """Tokens whose experts differ: x_decode's routed one row at a time, x_prefill's all at once."""
    pairs = zip(chosen_sets(ffn, x_decode, True), chosen_sets(ffn, x_prefill, False), strict=True)
    return sum(a != b for a, b in pairs)


def expert(mf: ModelFile, info: TensorInfo, e: int) -> torch.Tensor:
    rows = info.shape[1]
    return dequantize_tensor(info, torch.arange(e * rows, (e + 1) * rows)).reshape(rows, -1)


def oracle(mf: ModelFile, prefix: str, ffn: MoEFFN, x: torch.Tensor) -> torch.Tensor:
    """The layer's math in float32 on the CPU, from the file's tensors."""
    t = lambda name: mf.tensor(f"{prefix}.{name}.weight")  # noqa: E731
    swiglu = lambda h, gate, up, down: (F.silu(h @ gate.T) * (h @ up.T)) @ down.T  # noqa: E731
    probs = torch.softmax(x @ dequantize_tensor(t("ffn_gate_inp")).T, -1)
    weights, ids = probs.topk(ffn.shape.n_used, -1)
    if ffn.shape.norm_top_k:
        weights = weights / weights.sum(-1, keepdim=True)
    fused = f"{prefix}.ffn_gate_up_exps.weight" in mf.tensors
    out = torch.zeros_like(x)
    for row in range(x.shape[0]):
        for w, e in zip(weights[row].tolist(), ids[row].tolist(), strict=True):
            if fused:
                gate, up = expert(mf, t("ffn_gate_up_exps"), e).chunk(2)
            else:
                gate, up = expert(mf, t("ffn_gate_exps"), e), expert(mf, t("ffn_up_exps"), e)
            out[row] += w * swiglu(x[row], gate, up, expert(mf, t("ffn_down_exps"), e))
    if f"{prefix}.ffn_up_shexp.weight" in mf.tensors:
        shared = [dequantize_tensor(t(f"ffn_{n}_shexp")) for n in ("gate", "up", "down")]
        scale = torch.sigmoid(x @ dequantize_tensor(t("ffn_gate_inp_shexp")).reshape(-1, 1))
        out += scale * swiglu(x, *shared)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="GGUF file with mixture-of-experts FFNs (qwen35moe)")
    parser.add_argument("-n", "--tokens", type=int, default=256, help="validation tokens (default 256)")
    parser.add_argument("--device", default="cuda", help="device (default cuda)")
    parser.add_argument("--oracle-tokens", type=int, default=4, help="rows checked by the oracle (default 4)")
    args = parser.parse_args()
    options = RunOptions(device=args.device, graphs=False)  # hooks record eager calls, not replays
    engine = Engine(args.model, options, context=args.tokens, batch_size=args.tokens)  # one chunk
    moe = [(i, layer.ffn) for i, layer in enumerate(engine.model.layers) if isinstance(layer.ffn, MoEFFN)]
    log: dict = {"mode": "decode", "decode": [], "prefill": []}
    for _, ffn in moe:
        recording(ffn, log)
    tokens = validation_tokens(engine, args.tokens)
    with torch.inference_mode():
        for position, token in enumerate(tokens):
            decoded = engine.decode(token, position)
        log["mode"] = "prefill"
        prefilled = engine.prefill(tokens)
        log["mode"] = None
        d = compare_logits(decoded, prefilled)
        print(f"eager decode vs prefill: cosine={d.cosine:.6f} max_abs_diff={d.max_abs_diff:.3e}")
        print(f"routes: {sorted(set(engine.model.routes().items()))}")
        print("layer  mixer      in        flips  out       same-in   flips  oracle:decode prefill")
        n_moe = len(moe)
        for j, (i, ffn) in enumerate(moe):
            dec = [log["decode"][j + n_moe * t] for t in range(args.tokens)]
            x_dec, y_dec = torch.cat([x for x, _ in dec]), torch.cat([y for _, y in dec])
            x_pre, y_pre = log["prefill"][j]
            x = x_pre.to(engine.device)
            passes_flips, same_flips = flips(ffn, x_dec.to(engine.device), x), flips(ffn, x, x)
            one_by_one = torch.cat([ffn(x[t : t + 1]) for t in range(x.shape[0])]).float().cpu()
            k = args.oracle_tokens
            want = oracle(engine.file, f"blk.{i}", ffn, x_pre[:k])
            mixer = "deltanet" if i in engine.model.recurrent_layers else "attention"
            print(
                f"{i:5d}  {mixer:9s}  {rel(x_pre, x_dec):.2e}  {passes_flips:5d}  {rel(y_pre, y_dec):.2e}  "
                f"{rel(y_pre, one_by_one):.2e}  {same_flips:5d}  {rel(one_by_one[:k], want):.2e}     "
                f"{rel(y_pre[:k], want):.2e}",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""`--speculative mtp` against plain decoding on the CPU, on tiny random Qwen3.5 models with a
multi-token-prediction block, converted to Q8_0 by llama.cpp's own convert_hf_to_gguf.py (the test
suite's converter, tests/models/converted.py), so that every product runs on the int8 kernel and the
drafts are verified in one batch-invariant pass.

Random weights give drafts that the trunk almost never accepts, so the "random" model measures the cost
of MTP speculation when it fails. The "aligned" model measures its ceiling: its trunk's blocks write
almost nothing to the residual stream (output projections scaled by 1e-3), so the next token is nearly a
function of the current one, and its MTP block is built to compute that same function of its input
token (eh_proj passes the normed embedding through, its block writes nearly nothing, its head norm is
the output norm): its drafts are the trunk's own next tokens, as a well-trained block's mostly are.

Usage: python scripts/mtp_cpu_speedup.py SHAPE OUT_DIR [bench flags] (SHAPE: small, 0.8b-8); prints
gufo bench's JSON lines (tg128 and tg128-mtp with its acceptance) for each model; `--device cuda` among
the bench flags measures the GPU's route (graph replays, each verification one replay). Needs transformers,
the converter download (as the tests do) and ../shared's GPT-2 vocabulary. docs/decisions.md, "Speculation
from the file's multi-token-prediction block", has the numbers of `0.8b-8 OUT -r 3 -t 1` on the CPU.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "models"))

from converted import convert  # noqa: E402
from qwen35_gguf import with_mtp  # noqa: E402

GPT2_VOCAB = ROOT.parent / "shared" / "vocab" / "ggml-vocab-gpt-2.gguf"
SHAPES = {
    # about 82 M parameters, two thirds of them the GPT-2-sized embedding and output
    "small": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
    ),
    # Qwen3.5-0.8B's layer shapes with 8 of its 24 layers (about 270 M parameters): the products weigh
    # more against the per-token work than in "small"
    "0.8b-8": dict(
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
    ),
}
QUIET = 1e-3  # the aligned model's scale of every block's output projection


def model(shape: dict, aligned: bool):
    import transformers

    config = transformers.Qwen3_5TextConfig(
        **shape,
        vocab_size=50257,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False,
    )
    hf = with_mtp(transformers.Qwen3_5ForCausalLM(config).eval())
    with torch.no_grad():
        for name, param in hf.named_parameters():  # as tiny_hf_model, products scaled by their width
            if name.endswith("linear_attn.norm.weight"):
                param.fill_(1.0)
            elif "norm" in name:
                param.copy_(0.2 * torch.randn_like(param))
            elif name.endswith("A_log"):
                param.copy_(torch.empty_like(param).uniform_(0.5, 8.0).log())
            elif name.endswith("dt_bias") or "conv1d" in name:
                param.copy_(0.4 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) * (0.6 if "embed" in name else param.shape[-1] ** -0.5))
        if aligned:
            for name, param in hf.named_parameters():
                if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                    param.mul_(QUIET)
            mtp, hidden = hf.mtp, shape["hidden_size"]
            mtp.fc.weight.zero_()
            mtp.fc.weight[:, :hidden] = torch.eye(hidden)
            mtp.pre_fc_norm_embedding.weight.zero_()
            mtp.norm.weight.copy_(hf.model.norm.weight)
    return hf


def main() -> None:
    shape, out, bench = SHAPES[sys.argv[1]], Path(sys.argv[2]), sys.argv[3:] or ["-r", "3"]
    for name in ("random", "aligned"):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(0)
        hf = model(shape, name == "aligned")
        path = convert(
            hf, folder, "--outtype", "q8_0", gpt2_vocab=GPT2_VOCAB, config={"mtp_num_hidden_layers": 1}
        )
        print(f"## {name}: {path}", flush=True)
        command = [sys.executable, "-m", "gufo.cli.main", "bench", "-m", str(path), "-p", "0", "-n", "128"]
        subprocess.run([*command, "--speculative", "mtp", "-o", "jsonl", *bench], check=True)


if __name__ == "__main__":
    main()

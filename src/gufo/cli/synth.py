"""`gufo synth`: write a random-weight GGUF of a real model shape, for benchmarking without a download."""

from __future__ import annotations

import argparse
import sys

from gufo.cli.commands import summary
from gufo.cli.common import byte_size, positive_int
from gufo.gguf.aliases import ALIASES, resolve_model
from gufo.tools.synth.presets import PRESETS, find_preset
from gufo.tools.synth.type_mix import DYNAMIC_MIXES, MIXES, find_mix

DEFAULT_VOCAB = "smollm2-135m"


def register(subparsers: argparse._SubParsersAction) -> None:
    presets = "; ".join(f"{arch}: {', '.join(shapes)}" for arch, shapes in PRESETS.items())
    parser = subparsers.add_parser(
        "synth",
        help=summary("synth"),
        description="Write a GGUF file with the real tensor shapes of a model, random weights written "
        "directly as quantized blocks (weights ~0.02 standard deviation, norms 1.0), llama-quantize's "
        "per-tensor type mix for --qtype, and a real vocabulary copied from another GGUF, so that both "
        "gufo and llama.cpp can load and benchmark it. It produces noise, not text. qwen35 is the dense "
        "Qwen3.5 hybrid (Gated DeltaNet layers, gated full attention every 4th layer), written as "
        "`convert_hf_to_gguf.py --no-mtp` lays it out (without the multi-token-prediction block, unless "
        "--mtp); qwen35moe "
        "is its mixture-of-experts variant (routed experts plus a shared one in every FFN; preset tiny is "
        "a small test shape, no real model). The "
        "file (or the parts of a split file, --split-max-size) is written in a temporary folder beside FILE "
        "and renamed when complete; progress goes to stderr when it is a terminal.",
    )
    parser.add_argument(
        "--arch", default="qwen3", help=f"architecture (known: {', '.join(PRESETS)}; default qwen3)"
    )
    parser.add_argument(
        "--preset", required=True, help=f"model size, shapes from the official configs ({presets})"
    )
    parser.add_argument(
        "--qtype",
        default="Q4_K_M",
        help=f"llama-quantize type name whose per-tensor mix to follow ({', '.join(MIXES)}), or a dynamic "
        f"per-layer mix modelled on unsloth's UD files ({', '.join(DYNAMIC_MIXES)}: docs/decisions.md gives "
        "its rule); default Q4_K_M",
    )
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="GGUF file to write")
    parser.add_argument(
        "--vocab-from",
        default=DEFAULT_VOCAB,
        metavar="MODEL",
        help=f"GGUF path or alias ({', '.join(sorted(ALIASES))}) whose tokenizer is copied; its vocabulary "
        f"size sets the embedding and output rows (default {DEFAULT_VOCAB})",
    )
    parser.add_argument(
        "--split-max-size",
        type=byte_size,
        default=0,
        metavar="SIZE",
        help="write a split file as llama.cpp's gguf-split does: parts FILE-00001-of-0000N.gguf, ... (FILE "
        "without .gguf) of at most SIZE bytes of tensor data each (a larger tensor gets a part of its own), "
        "the metadata in the first; SIZE like 500M or 2G (K, M, G: 1000, 1000^2, 1000^3 bytes, as llama.cpp "
        "counts). One plain FILE when everything fits in one part",
    )
    parser.add_argument("--force", action="store_true", help="overwrite FILE (or its parts) if it exists")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed writes the same file")
    parser.add_argument(
        "--layers",
        type=positive_int,
        default=None,
        metavar="N",
        help="use N layers instead of the preset's, for quick tests (then not the real model's size)",
    )
    parser.add_argument(
        "--mtp",
        action="store_true",
        help="qwen35, qwen35moe: also write the multi-token-prediction block after the layers, as "
        "convert_hf_to_gguf.py does without --no-mtp (for --speculative mtp)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from gufo.gguf.model_file import open_model_file
    from gufo.tools.synth.plan import plan_synth
    from gufo.tools.synth.writer import write_synth

    shape = find_preset(args.arch, args.preset)
    mix = find_mix(args.qtype)
    if args.layers is not None:
        shape = shape.with_layers(args.layers)
    vocab = open_model_file(resolve_model(args.vocab_from))
    plan = plan_synth(args.preset.lower(), shape, mix, vocab, args.mtp)
    # disable=None: a progress bar only when stderr is a terminal.
    with tqdm(
        total=plan.data_bytes, unit="B", unit_scale=True, desc="synth", file=sys.stderr, disable=None
    ) as bar:
        written = write_synth(
            plan,
            args.output,
            force=args.force,
            seed=args.seed,
            progress=bar.update,
            split_max_size=args.split_max_size,
        )
    files = (
        str(written[0]) if len(written) == 1 else f"{len(written)} parts {written[0]} .. {written[-1].name}"
    )
    print(
        f"wrote {files}: {args.arch} {plan.preset} {mix.name}, {shape.num_hidden_layers} layers"
        f"{' and the multi-token-prediction block' if args.mtp else ''}, "
        f"vocabulary {vocab.label} ({plan.tensors[0].shape[0]} tokens), "
        f"{plan.n_parameters / 1e9:.3f} B parameters, {plan.data_bytes / 2**30:.3f} GiB of tensor data"
    )
    return 0

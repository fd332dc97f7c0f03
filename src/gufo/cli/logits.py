"""`gufo logits`: one teacher-forced forward pass; top logits per position as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gufo.cli.commands import summary
from gufo.cli.common import add_engine_flags, parse_id_list, positive_int
from gufo.errors import BadInputError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "logits",
        help=summary("logits"),
        description="Run the given tokens through the model in one pass (teacher forcing; no sampling, no "
        "penalties) and print JSON: {model, tokens, positions: [{position, top: [[id, logit], ...]}]}. "
        "Position p's logits predict token p+1.",
    )
    add_engine_flags(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("-p", "--prompt", help="text to tokenize (BOS as the model asks)")
    source.add_argument("--ids", help="token ids, comma-separated (used as given: no BOS added)")
    parser.add_argument(
        "--top", type=positive_int, default=10, help="how many top logits per position (default 10)"
    )
    parser.add_argument(
        "--positions",
        choices=["last", "all"],
        default="last",
        help="report the last position only (default) or every position",
    )
    parser.add_argument(
        "--npy",
        type=Path,
        default=None,
        help="write the last position's full-vocabulary logits as float32 .npy",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from gufo.cli.common import make_engine

    engine = make_engine(args)
    if args.ids is not None:
        tokens = parse_id_list(args.ids, "--ids")
        vocab = engine.config.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise BadInputError(f"--ids: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    else:
        tokens = engine.tokenizer.encode(args.prompt, add_special=True, parse_special=False)
    every = args.positions == "all"
    logits = engine.prefill(tokens, all_logits=every)
    rows = logits if every else logits[None, :]
    first = 0 if every else len(tokens) - 1
    positions = []
    for offset, row in enumerate(rows):
        values, ids = torch.topk(row.float(), min(args.top, row.numel()))
        top = [[int(i), float(v)] for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
        positions.append({"position": first + offset, "top": top})
    if args.npy is not None:
        try:
            np.save(args.npy, rows[-1].float().numpy().astype(np.float32))
        except OSError as err:
            raise BadInputError(f"--npy {args.npy}: cannot write: {err.strerror}") from None
    print(json.dumps({"model": engine.path.name, "tokens": tokens, "positions": positions}))
    return 0

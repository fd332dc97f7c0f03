"""`gufo info`: what a GGUF file holds."""

from __future__ import annotations

import argparse
import json

from gufo.cli.commands import summary


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help=summary("info"),
        description="Architecture, parameter count, file size, tensor types, context length, vocabulary "
        "and chat template of a GGUF file (no weights are loaded). For a split file (any part may be "
        "named) the sizes and counts are of all parts, and each part is listed with its size and tensors.",
    )
    parser.add_argument("model", nargs="?", default=None, help="GGUF path or alias (default: gemma3-270m)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gufo.gguf.aliases import resolve_model
    from gufo.gguf.model_file import open_model_file
    from gufo.models.registry import known_architectures

    mf = open_model_file(resolve_model(args.model))
    arch = mf.architecture
    tokens = mf.get("tokenizer.ggml.tokens") or []
    info = {
        "file": mf.path.name,
        "file_size_bytes": mf.file_size,
        "gguf_version": mf.version,
        "architecture": arch,
        "architecture_supported": arch in known_architectures(),
        "name": mf.get("general.name"),
        "parameters": mf.n_parameters(),
        "tensor_count": len(mf.tensors),
        "tensor_types": dict(mf.type_histogram().most_common()),
        "context_length": mf.arch_key("context_length", None),
        "layers": mf.arch_key("block_count", None),
        "embedding_length": mf.arch_key("embedding_length", None),
        "vocab_size": len(tokens),
        "tokenizer": mf.get("tokenizer.ggml.model"),
        "pre_tokenizer": mf.get("tokenizer.ggml.pre"),
        "chat_template": mf.get("tokenizer.chat_template") is not None,
    }
    if len(mf.parts) > 1:
        info["parts"] = [
            {"file": part.path.name, "size_bytes": part.size, "tensor_count": part.n_tensors}
            for part in mf.parts
        ]
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "tensor_types":
            value = ", ".join(f"{k} x{v}" for k, v in value.items())
        elif key == "parameters":
            value = f"{value:,} ({value / 1e9:.3f} B)"
        elif key == "file_size_bytes":
            value = _size(value)
        elif key == "parts":  # the count here, then a line for each part
            value = len(value)
        print(f"{key:<{width}}  {value}")
    for part in info.get("parts", []):
        print(f"  {part['file']}  {_size(part['size_bytes'])}, {part['tensor_count']} tensors")
    return 0


def _size(n_bytes: int) -> str:
    return f"{n_bytes:,} ({n_bytes / 2**30:.3f} GiB)"

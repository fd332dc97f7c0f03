"""Loaders for the tokenizer tests: llama.cpp's vocabulary test vectors and the two real models.

Metadata is read with gufo's own GGUF header parser (``gguf.GGUFReader`` takes tens of seconds
on a 262k-token vocabulary); the expected values all come from llama.cpp's files in ../shared.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from gufo.gguf.model_file import open_model_file
from gufo.tokenizer import Tokenizer
from gufo.tokenizer.detok import BYTE_OF_CHAR

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
VOCAB_DIR = SHARED / "vocab"
TEMPLATES_DIR = VOCAB_DIR / "templates"
GOLDENS_DIR = SHARED / "goldens"

VOCABS = ("qwen2", "qwen35", "llama-bpe", "gpt-2", "deepseek-llm", "starcoder", "llama-spm", "phi-3")
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1", "gemma3-270m": "gemma-3-270m-q4_k_m"}
SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_path(name: str) -> Path:
    return VOCAB_DIR / f"ggml-vocab-{name}.gguf"


def vocab_cases(name: str) -> list[tuple[str, list[int]]]:
    """(input text, llama.cpp's ids) pairs, read the way llama.cpp's test-tokenizer-0 reads them."""
    path = vocab_path(name)
    raw = Path(f"{path}.inp").read_bytes().decode("utf-8")
    texts = raw.split(SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    lines = Path(f"{path}.out").read_bytes().decode("utf-8").split("\n")
    ids = [[int(x) for x in line.split()] for line in lines[: len(texts)]]
    assert len(ids) == len(texts), f"{path.name}: {len(texts)} inputs but {len(ids)} outputs"
    return list(zip(texts, ids, strict=True))


@cache
def metadata_of(path: str) -> dict[str, Any]:
    return open_model_file(path).metadata


@cache
def vocab_tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_gguf(metadata_of(str(vocab_path(name))))


BYTE_CHARS = sorted(BYTE_OF_CHAR, key=BYTE_OF_CHAR.get)  # id i is the character of byte i


def byte_level_tokenizer(pre: str, merges: list[str]) -> Tokenizer:
    """A hand-built BPE vocabulary: the 256 byte characters (ids 0-255), then one token per merge.

    Lets a test predict ids from the pre-tokenizer's word cuts alone: a merge applies only
    inside one word.
    """
    merged = [m.replace(" ", "") for m in merges]
    return Tokenizer.from_gguf(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": [*BYTE_CHARS, *merged],
            "tokenizer.ggml.merges": merges,
        }
    )


@cache
def model_file(alias: str) -> str:
    from gufo.gguf.aliases import resolve_model

    return str(resolve_model(alias))


@cache
def model_tokenizer(alias: str) -> Tokenizer:
    return Tokenizer.from_gguf(metadata_of(model_file(alias)))


@cache
def golden(alias: str) -> dict:
    return json.loads((GOLDENS_DIR / f"{MODELS[alias]}.json").read_text())

"""Tiny random transformers models converted to GGUF by llama.cpp's own `convert_hf_to_gguf.py`.

The converter and its bundled gguf-py come from the llama-cpp-python 0.3.36 sdist (downloaded once
from PyPI, checked against its SHA-256, cached in the user cache folder or under GUFO_TEST_CACHE), so
the files are laid out exactly as the ones people download: Q/K permuted for GGML's RoPE, rope_freqs
for llama3 scaling, YaRN keys, fused tensors with --fuse-qkv / --fuse-gate-up-exps. transformers, run
in float32 on the same weights, is the oracle of the logits.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

import platformdirs
import pytest
import torch

from gufo.gguf.header import parse_header

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SIMPLE_INDEX = "https://pypi.org/simple/llama-cpp-python/"
VENDOR = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
VOCAB = 96  # the sentencepiece vocabulary trained below; models pad theirs up to their vocab_size


def _sdist_url() -> str:
    request = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    return next(f["url"] for f in files if f["filename"] == SDIST)


def converter_dir() -> Path:
    """The folder holding convert_hf_to_gguf.py, its `conversion` package and gguf-py (made once)."""
    # GUFO_TEST_CACHE: a folder that already holds the converter (a GPU machine without network)
    cache = Path(os.environ.get("GUFO_TEST_CACHE") or platformdirs.user_cache_dir("gufo")) / "test-oracles"
    target = cache / "llama-cpp-python-0.3.36"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:  # parallel test workers extract it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "convert_hf_to_gguf.py").is_file():
            try:
                with urllib.request.urlopen(_sdist_url(), timeout=600) as response:
                    blob = response.read()
            except OSError as err:
                pytest.skip(f"cannot download the llama.cpp converter ({SDIST}): {err}")
            digest = hashlib.sha256(blob).hexdigest()
            assert digest == SDIST_SHA256, f"{SDIST}: sha256 {digest}, expected {SDIST_SHA256}"
            staging = Path(tempfile.mkdtemp(dir=cache))
            with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
                members = [
                    m for m in archive.getmembers()
                    if m.name.startswith(VENDOR) and m.name[len(VENDOR):].startswith(CONVERTER_PARTS)
                ]  # fmt: skip
                for member in members:
                    member.name = member.name[len(VENDOR) :]
                archive.extractall(staging, members=members, filter="data")
            staging.rename(target)
    return target


def write_gpt2_tokenizer(folder: Path, vocab_gguf: Path) -> int:
    """GPT-2's byte-level BPE (tokenizer.json) rebuilt from llama.cpp's vocabulary file: the converter
    recognises its pre-tokenizer by hash, as it must for architectures it reads only BPE vocabularies
    of (qwen3next). Returns its size."""
    text, size = _gpt2_tokenizer_json(vocab_gguf)
    (folder / "tokenizer.json").write_text(text)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return size


@functools.cache
def _gpt2_tokenizer_json(vocab_gguf: Path) -> tuple[str, int]:
    """tokenizer.json's text and the vocabulary's size, built once per test process (5 CPU s with the
    gguf package's reader; gufo's header parser reads the 50k tokens and merges in a tenth of that)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    metadata = parse_header(vocab_gguf.read_bytes()).metadata
    tokens = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ")) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer.to_str(pretty=True), len(tokens)


def write_tokenizer(folder: Path) -> None:
    """A small sentencepiece model (tokenizer.model), which the converter reads for llama, qwen3, gemma3."""
    spm = pytest.importorskip("sentencepiece")
    words = [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "was",
        "for",
        "on",
        "with",
        "as",
        "by",
        "at",
        "from",
        "that",
        "this",
        "it",
        "be",
        "are",
        "an",
        "or",
        "we",
    ]
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(12)) for i in range(400)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=VOCAB,
        model_type="bpe",
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    (folder / "tokenizer.model").write_bytes(model.getvalue())


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights of a trained model's scale: norms near 1 (Gemma's norms compute 1 + w, so w near 0),
    projections ~0.12, biases ~0.3, embeddings ~0.6."""
    norm_centre = 0.0 if type(model).__name__.startswith("Gemma") else 1.0
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(norm_centre + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.3 * torch.randn_like(param))
            else:
                param.copy_(torch.randn_like(param) * (0.6 if "embed" in name else 0.12))
    return model.eval()


def convert(
    model: torch.nn.Module,
    folder: Path,
    *flags: str,
    gpt2_vocab: Path | None = None,
    config: dict | None = None,
) -> Path:
    """Save `model` with a tokenizer (sentencepiece, or GPT-2's BPE from `gpt2_vocab`) and convert it
    to an F32 GGUF with the converter's `flags`; `config` overrides entries of the saved config.json."""
    hf_dir, out = folder / "hf", folder / "model.gguf"
    model.save_pretrained(hf_dir)
    if config:
        saved = json.loads((hf_dir / "config.json").read_text())
        (hf_dir / "config.json").write_text(json.dumps({**saved, **config}))
    if gpt2_vocab is None:
        write_tokenizer(hf_dir)
    else:
        write_gpt2_tokenizer(hf_dir, gpt2_vocab)
    code, log = _converter().convert([str(hf_dir), "--outfile", str(out), "--outtype", "f32", *flags])
    assert code == 0, f"the converter failed:\n{log[-3000:]}"
    return out


class _Converter:
    """The converter process of this test process (converter_zygote.py: imported once, forked per file)."""

    def __init__(self) -> None:
        script = Path(__file__).with_name("converter_zygote.py")
        self.process = subprocess.Popen(
            [sys.executable, str(script), str(converter_dir())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def convert(self, args: list[str]) -> tuple[int, str]:
        self.process.stdin.write(json.dumps(args) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"the converter process ended (exit {self.process.wait()})"
        done = json.loads(answer)
        return done["code"], done["log"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


@functools.cache
def _converter() -> _Converter:
    converter = _Converter()
    atexit.register(converter.close)
    return converter


def hf_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens[None]).logits[0].float()


def gufo_logits(path: Path, backend: str, tokens: torch.Tensor) -> torch.Tensor:
    """Every position's logits from one prefill pass of gufo's model on `backend`."""
    from gufo.gguf.model_file import open_model_file
    from gufo.models.registry import build_model

    model = build_model(open_model_file(path), backend)
    cache = model.new_cache(1, tokens.shape[0])
    with torch.inference_mode():
        return model.forward(tokens.to(model.device), cache, 0, 0, all_logits=True).float().cpu()

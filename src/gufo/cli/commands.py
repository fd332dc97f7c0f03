"""The commands: name -> (module of gufo.cli, one-line summary). `gufo --help` lists them from here,
so that it imports no command module (and no torch); a command's module is imported only to run it."""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "generate text from a prompt"),
    "chat": ("chat", "interactive chat with the model's chat template"),
    "tokenize": ("tokenize", "tokenize text with a model's vocabulary"),
    "logits": ("logits", "raw logits of one forward pass (numerics debugging)"),
    "info": ("info", "describe a GGUF model file"),
    "bench": ("bench", "benchmark prompt processing and generation (llama-bench compatible)"),
    "compare": ("compare", "compare benchmark runs (gufo bench or llama-bench JSON) test by test"),
    "profile": ("profile", "where bench's time goes per stage and kernel (torch.profiler); compare two"),
    "parity": (
        "parity",
        "check that speculative decoding reproduces plain greedy decoding on a prompt corpus",
    ),
    "quality": (
        "quality",
        "teacher-forced KL / top-1 / perplexity comparison against saved reference logits",
    ),
    "kernels": ("kernels", "report per-kernel registers, scratch, spills, LDS and occupancy of GPU binaries"),
    "synth": ("synth", "write a random-weight GGUF of a real model shape"),
    "serve": ("serve", "OpenAI-compatible HTTP server with concurrent sessions"),
    "bench-serve": ("bench_serve", "benchmark a running OpenAI-compatible server from the client side"),
}


def summary(command: str) -> str:
    return COMMANDS[command][1]

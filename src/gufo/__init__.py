"""gufo: local LLM inference for GGUF models."""

__version__ = "0.1.0"

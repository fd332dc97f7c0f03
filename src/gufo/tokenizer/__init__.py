"""Tokenizers of GGUF models (agreeing with llama.cpp) and chat templates.

tok = Tokenizer.from_gguf(metadata)
ids = tok.encode("Hello")            # BOS added when the model asks for it
text = tok.decode(ids)
"""

from gufo.tokenizer.detok import StreamDecoder
from gufo.tokenizer.tokenizer import Tokenizer

__all__ = ["StreamDecoder", "Tokenizer"]

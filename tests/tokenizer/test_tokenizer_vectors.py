"""llama.cpp's tokenizer test vectors (../shared/vocab): every input must give llama.cpp's ids.

llama.cpp's test-tokenizer-0 tokenizes with add_special=false and parse_special=false.
"""

from __future__ import annotations

import pytest
from tokenizer_oracles import VOCABS, vocab_cases, vocab_tokenizer

CASES = [(name, i) for name in VOCABS for i in range(len(vocab_cases(name)))]


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_vocab_vector(name: str, index: int) -> None:
    text, expected = vocab_cases(name)[index]
    assert vocab_tokenizer(name).encode(text, add_special=False, parse_special=False) == expected


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_vector_count(name: str) -> None:
    # the split of the .inp file matches llama.cpp's (one output line per input)
    assert len(vocab_cases(name)) >= 46


def test_bos_rules_follow_llama_cpp() -> None:
    # llama-bpe has no add_bos_token key: llama.cpp adds BOS for the llama3 pre-tokenizer;
    # SentencePiece vocabularies add it by default; gpt-2 does not
    assert vocab_tokenizer("llama-bpe").add_bos
    assert vocab_tokenizer("llama-spm").add_bos
    assert not vocab_tokenizer("gpt-2").add_bos
    tok = vocab_tokenizer("llama-bpe")
    assert tok.encode("Hello")[0] == tok.bos_id == 128000
    assert tok.encode("Hello", add_special=False)[0] != 128000

"""llama.cpp's tokenizer test vectors (../shared/vocab): every input must give llama.cpp's ids.

llama.cpp's test-tokenizer-0 tokenizes with add_special=false and parse_special=false.
"""

from __future__ import annotations

import pytest
from tokenizer_oracles import BYTE_CHARS, VOCABS, byte_level_tokenizer, vocab_cases, vocab_tokenizer

CASES = [(name, i) for name in VOCABS for i in range(len(vocab_cases(name)))]


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_vocab_vector(name: str, index: int) -> None:
    text, expected = vocab_cases(name)[index]
    assert vocab_tokenizer(name).encode(text, add_special=False, parse_special=False) == expected


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_vector_count(name: str) -> None:
    # the split of the .inp file matches llama.cpp's (one output line per input)
    assert len(vocab_cases(name)) >= 46


# The one difference of llama.cpp's qwen35 regex from qwen2's: combining marks (\p{M}) stay in
# the word. The .out files cannot show it (no Qwen merge joins a letter and a following mark, so
# qwen35's "résumé" vector passes with either regex); a vocabulary whose merges join "e" and
# U+0301 does. Expected ids: bytes are ids 0-255, U+0301 is 256, "e" + U+0301 is 257.
RESUME_NFD = "re\u0301sume\u0301"  # qwen35.inp's "résumé" (decomposed)
_MARK = "".join(BYTE_CHARS[b] for b in "\u0301".encode())


@pytest.mark.parametrize(
    ("pre", "expected"),
    [
        ("qwen35", [114, 257, 115, 117, 109, 257]),  # one word: "résumé"
        ("qwen2", [114, 101, 256, 115, 117, 109, 101, 256]),  # "re", U+0301 "sume", U+0301
    ],
)
def test_combining_marks_stay_in_words_only_for_qwen35(pre: str, expected: list[int]) -> None:
    tok = byte_level_tokenizer(pre, [" ".join(_MARK), f"e {_MARK}"])
    assert tok.encode(RESUME_NFD, add_special=False) == expected


def test_bos_rules_follow_llama_cpp() -> None:
    # llama-bpe has no add_bos_token key: llama.cpp adds BOS for the llama3 pre-tokenizer;
    # SentencePiece vocabularies add it by default; gpt-2 does not
    assert vocab_tokenizer("llama-bpe").add_bos
    assert vocab_tokenizer("llama-spm").add_bos
    assert not vocab_tokenizer("gpt-2").add_bos
    tok = vocab_tokenizer("llama-bpe")
    assert tok.encode("Hello")[0] == tok.bos_id == 128000
    assert tok.encode("Hello", add_special=False)[0] != 128000

"""Bad tokenizer metadata gives one clear BadInputError line; special-token stripping rules."""

from __future__ import annotations

import pytest
from tokenizer_oracles import BYTE_CHARS, byte_level_tokenizer, metadata_of, vocab_path, vocab_tokenizer

from gufo.errors import BadInputError
from gufo.tokenizer import Tokenizer, pretok

BPE_META = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.tokens": ["a", "b", "ab"],
    "tokenizer.ggml.token_type": [1, 1, 1],
    "tokenizer.ggml.merges": ["a b"],
}


def one_line_error(meta: dict) -> str:
    with pytest.raises(BadInputError) as info:
        Tokenizer.from_gguf(meta)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    return message


def test_unknown_tokenizer_model() -> None:
    message = one_line_error({**BPE_META, "tokenizer.ggml.model": "bert"})
    assert "unknown tokenizer model 'bert'" in message and "tokenizer.ggml.model" in message


def test_unknown_pre_tokenizer() -> None:
    message = one_line_error({**BPE_META, "tokenizer.ggml.pre": "made-up"})
    assert "unknown pre-tokenizer 'made-up'" in message and "tokenizer.ggml.pre" in message


def test_missing_pieces() -> None:
    assert "tokenizer.ggml.model" in one_line_error({})
    assert "tokenizer.ggml.tokens" in one_line_error({**BPE_META, "tokenizer.ggml.tokens": []})
    assert "tokenizer.ggml.merges" in one_line_error({k: v for k, v in BPE_META.items() if "merges" not in k})
    assert "token_type" in one_line_error({**BPE_META, "tokenizer.ggml.token_type": [1]})


def test_tiny_vocabulary_works() -> None:
    tok = Tokenizer.from_gguf(BPE_META)
    assert tok.encode("ab", add_special=False) == [2]
    assert tok.decode([2, 0]) == "aba"


def test_phi3_special_tokens_swallow_following_spaces() -> None:
    # llama.cpp gives Phi-3's special tokens the rstrip attribute: the spaces after them are
    # dropped, and SentencePiece then puts its space prefix in front of the next text; </s> is an
    # end-of-generation text, so it counts as control and is matched only with parse_special
    assert "phi3" in str(metadata_of(str(vocab_path("phi-3")))["general.name"]).lower()
    tok = vocab_tokenizer("phi-3")
    end = tok.encode("</s>", add_special=False, parse_special=True)
    assert len(end) == 1 and end[0] in tok.eog_ids
    assert len(tok.encode("</s>", add_special=False, parse_special=False)) > 1
    ids = tok.encode("Hi</s>   there", add_special=False, parse_special=True)
    assert ids == tok.encode("Hi", add_special=False) + end + tok.encode("there", add_special=False)


@pytest.mark.parametrize("pre", pretok.SUPPORTED)
def test_every_supported_pre_tokenizer_builds(pre: str) -> None:
    # the regexes of pre-tokenizers without test vectors at least compile and lose no text
    tok = byte_level_tokenizer(pre, ["H e", "l l", "He ll"])
    text = "Hello World 123 'tis  ÄÖü 日本 \n\n x\t"
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text
    assert ids[0] == len(BYTE_CHARS) + 2  # "Hello" starts with the merged "Hell"

"""The two real models against llama.cpp's goldens (../shared/goldens): tokenization of every
prompt (acceptance item 1), detokenization of the greedy continuations, special ids, EOG set."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizer_oracles import MODELS, golden, metadata_of, model_file, model_tokenizer

from gufo.tokenizer import Tokenizer

ALIASES = tuple(MODELS)


@pytest.mark.parametrize("alias", ALIASES)
def test_prompt_ids_match_llama_cpp(alias: str) -> None:
    # the goldens were tokenized with add_special=true (BOS only if add_bos_token), parse_special=false
    tok = model_tokenizer(alias)
    for prompt in golden(alias)["prompts"]:
        ids = tok.encode(prompt["prompt"], add_special=True, parse_special=False)
        assert ids == prompt["prompt_ids"], prompt["id"]


@pytest.mark.parametrize("alias", ALIASES)
def test_greedy_text_matches_llama_detokenize(alias: str) -> None:
    # greedy_text = llama_detokenize(ids, remove_special=false, unparse_special=true)
    tok = model_tokenizer(alias)
    for prompt in golden(alias)["prompts"]:
        assert tok.decode(prompt["greedy_ids"]) == prompt["greedy_text"], prompt["id"]
        assert tok.decode(prompt["greedy_ids_ignore_eos"]) == prompt["greedy_text_ignore_eos"], prompt["id"]


@pytest.mark.parametrize("alias", ALIASES)
def test_special_ids_and_eog_match_llama_cpp(alias: str) -> None:
    tok = model_tokenizer(alias)
    g = golden(alias)
    assert tok.bos_id == g["bos_id"]
    assert tok.eos_id == g["eos_id"]
    assert tok.add_bos == g["settings"]["add_bos"]
    assert tok.vocab_size == g["settings"]["n_vocab"]
    assert tok.eog_ids == frozenset(g["eog_ids"])
    assert [tok.token_text(t) for t in g["eog_ids"]] == g["eog_tokens"]


def test_gemma3_vocab_loads_fast() -> None:
    metadata = metadata_of(model_file("gemma3-270m"))
    start = time.process_time()
    tok = Tokenizer.from_gguf(metadata)
    seconds = time.process_time() - start
    assert tok.vocab_size == 262144
    assert seconds < 1.5, f"building the gemma3 tokenizer took {seconds:.2f} s of CPU"


def test_empty_text() -> None:
    gemma, smol = model_tokenizer("gemma3-270m"), model_tokenizer("smollm2-135m")
    assert gemma.encode("") == [gemma.bos_id]
    assert gemma.encode("", add_special=False) == []
    assert smol.encode("") == []
    assert gemma.decode([]) == ""


def test_user_defined_tokens_match_without_parse_special() -> None:
    # gemma3 marks runs of newlines and spaces as user-defined tokens: llama.cpp matches them as
    # whole tokens (longest first) even when control tokens are not parsed
    tok = model_tokenizer("gemma3-270m")
    tokens = metadata_of(model_file("gemma3-270m"))["tokenizer.ggml.tokens"]
    ids = tok.encode("a\n\n\nb", add_special=False, parse_special=False)
    assert tokens.index("\n\n\n") in ids
    assert tokens.index("\n") not in ids


def test_special_tokens_are_matched_longest_first() -> None:
    # llama.cpp splits on each special token in turn, longest text first: 40 newlines become the
    # 31-newline token (gemma3's longest) and then the 9-newline one
    tok = model_tokenizer("gemma3-270m")
    tokens = metadata_of(model_file("gemma3-270m"))["tokenizer.ggml.tokens"]
    assert "\n" * 32 not in tokens
    ids = tok.encode("\n" * 40, add_special=False, parse_special=False)
    assert ids == [tokens.index("\n" * 31), tokens.index("\n" * 9)]


@pytest.mark.parametrize(
    ("alias", "open_tag", "close_tag"),
    [("smollm2-135m", "<|im_start|>", "<|im_end|>"), ("gemma3-270m", "<start_of_turn>", "<end_of_turn>")],
)
def test_control_tokens_only_with_parse_special(alias: str, open_tag: str, close_tag: str) -> None:
    tok = model_tokenizer(alias)
    tokens = metadata_of(model_file(alias))["tokenizer.ggml.tokens"]
    open_id, close_id = tokens.index(open_tag), tokens.index(close_tag)
    text = f"{open_tag}user\nHi{close_tag}"
    parsed = tok.encode(text, add_special=False, parse_special=True)
    assert parsed[0] == open_id and parsed[-1] == close_id
    inner = tok.encode("user\nHi", add_special=False, parse_special=True)
    assert parsed[1:-1] == inner
    plain = tok.encode(text, add_special=False, parse_special=False)
    assert open_id not in plain and close_id not in plain
    assert tok.decode(plain) == text
    assert tok.decode(parsed) == text
    assert tok.decode(parsed, skip_special=True) == "user\nHi"


def test_token_text() -> None:
    smol = model_tokenizer("smollm2-135m")
    smol_tokens = metadata_of(model_file("smollm2-135m"))["tokenizer.ggml.tokens"]
    assert smol.token_text(smol_tokens.index("ĠParis")) == " Paris"  # "Ġ" is the byte-level space
    assert smol.token_text(smol_tokens.index("<|im_end|>")) == "<|im_end|>"
    gemma = model_tokenizer("gemma3-270m")
    gemma_tokens = metadata_of(model_file("gemma3-270m"))["tokenizer.ggml.tokens"]
    assert gemma.token_text(gemma_tokens.index("▁Paris")) == " Paris"
    assert gemma.token_text(gemma_tokens.index("<0xE4>")) == "<0xE4>"  # half a character, shown as a byte
    assert gemma.token_text(gemma_tokens.index("<0x41>")) == "A"


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=" ▁<>/pabc.é日\n", max_size=30))
def test_sentencepiece_word_cuts_change_nothing(text: str) -> None:
    # gemma3 text is merged word by word (cut before a "▁" that no token spans, e.g. not after ">",
    # because of the token "> </"): the result must equal merging the whole text at once
    spm = model_tokenizer("gemma3-270m")._spm
    escaped = text.replace(" ", "▁")
    assert spm.encode(escaped) == spm._encode_word(escaped)

"""A json_object reply fits its token budget: whatever a model picks among the tokens the mask leaves, the
reply it has when the budget runs out parses. Python's `json` module is the oracle for "parses",
xgrammar's matcher of the grammar for "the grammar accepts it". The vocabulary: every byte, tokens that
open or close several things at once (the ones the growth bound is for), then the end of generation."""

from __future__ import annotations

import json
import random

import numpy as np
import torch
import xgrammar
from hypothesis import given, settings
from hypothesis import strategies as st

from gufo.engine.constraint import JSON_OBJECT, BatchMasker, TokenConstraint
from gufo.engine.json_closing import BudgetTable, Cursor

MULTI = [
    b'", "', b'": "', b'": {"', b'": [', b'"}', b"}}", b"]]", b"}]", b"[[[", b'{"', b'"a"', b'", "b": [',
    b"true", b"fal", b"null}", b"\\u00", b"\\u", b"\\", b"-0.", b"1e", b"e-", b"12345", b"0, ",
    b', "', b'", "x": {"y": ["', b'"\\', b"\xc3", b"\xa9", b"\xe0\xa4", b"\xf0\x9f", b"\x98\x80",
]  # fmt: skip
TOKENS = [bytes([b]) for b in range(256)] + MULTI
EOG = len(TOKENS)
VOCAB = EOG + 1
PIECES = [*TOKENS, b""]
INFO = xgrammar.TokenizerInfo(PIECES, vocab_size=VOCAB, stop_token_ids=[EOG])
GRAMMAR = xgrammar.GrammarCompiler(INFO, max_threads=1).compile_grammar(
    xgrammar.Grammar.from_ebnf(JSON_OBJECT)
)
TABLE = BudgetTable(PIECES)


def grammatical(text: bytes) -> bool:
    """The oracle of the grammar: every byte of `text`, then the end of generation, is accepted."""
    constraint = TokenConstraint(GRAMMAR, VOCAB)
    return all(constraint.advance(byte) for byte in text) and constraint.advance(EOG)


values = st.recursive(
    st.none()
    | st.booleans()
    | st.text(max_size=5)
    | st.integers(-999, 999)
    | st.sampled_from([0.5, -2.25, 1e-7]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=3), values, max_size=4), st.booleans())
def test_every_prefix_with_its_closing_parses_and_is_grammatical(obj, ascii_only):
    text = json.dumps(obj, ensure_ascii=ascii_only).encode()
    cursor = Cursor()
    for end in range(len(text) + 1):
        completed = text[:end] + cursor.closing()
        assert isinstance(json.loads(completed), dict), completed
        assert grammatical(completed), completed
        if end < len(text):
            cursor = cursor.step(text[end])
            assert cursor is not None, text[: end + 1]
    assert cursor.closing() == b""


def walk(constraint: TokenConstraint, budget: int, rng: random.Random) -> list[int]:
    """A model that picks among what the mask leaves, the multi-byte tokens half the time."""
    tokens: list[int] = []
    for _ in range(budget):
        allowed = torch.isfinite(constraint.mask(torch.zeros(VOCAB))).nonzero().flatten().tolist()
        assert allowed, tokens
        multi = [t for t in allowed if 256 <= t < EOG]
        token = rng.choice(multi if multi and rng.random() < 0.5 else allowed)
        constraint.accept(token)
        tokens.append(token)
        if token == EOG:
            break
    return tokens


@settings(max_examples=80, deadline=None)
@given(st.integers(2, 40), st.randoms(use_true_random=False))
def test_a_reply_cut_by_its_budget_parses(budget, rng):
    constraint = TokenConstraint(GRAMMAR, VOCAB, TABLE)
    constraint.fit(budget)
    tokens = walk(constraint, budget, rng)
    text = b"".join(PIECES[t] for t in tokens)
    assert len(tokens) <= budget
    assert isinstance(json.loads(text), dict), text
    assert grammatical(text), text


def test_without_a_budget_the_reply_runs_on_unclosed():
    """The oracle's counterpart: the same walks without `fit` leave most replies open at that length."""
    unclosed = 0
    for seed in range(20):
        tokens = walk(TokenConstraint(GRAMMAR, VOCAB, TABLE), 12, random.Random(seed))
        try:
            json.loads(b"".join(PIECES[t] for t in tokens))
        except ValueError:
            unclosed += 1
    assert unclosed >= 10


@settings(max_examples=40, deadline=None)
@given(st.integers(4, 30), st.randoms(use_true_random=False))
def test_growing_is_exactly_the_tokens_that_grow_past_the_slack(budget, rng):
    """Against every token walked byte by byte from the states of random replies."""
    constraint = TokenConstraint(GRAMMAR, VOCAB, TABLE)
    constraint.fit(budget)
    cursor = Cursor().run(b"".join(PIECES[t] for t in walk(constraint, budget // 2, rng)))
    everything = np.full((VOCAB + 31) // 32, -1, dtype=np.int32)
    for slack in range(0, 12):
        growing = set(TABLE.growing(cursor, slack, everything).tolist())
        for token, piece in enumerate(PIECES):
            after = cursor.run(piece)
            if after is not None:
                grows = len(after.closing()) - len(cursor.closing()) > slack
                assert (token in growing) == grows, (cursor, piece, slack)


def test_a_rolled_back_draft_leaves_the_mask_as_it_was():
    rng = random.Random(3)
    constraint = TokenConstraint(GRAMMAR, VOCAB, TABLE)
    constraint.fit(10)
    walk(constraint, 5, rng)
    before = torch.isfinite(constraint.mask(torch.zeros(VOCAB)))
    for _ in range(4):
        allowed = torch.isfinite(constraint.mask(torch.zeros(VOCAB))).nonzero().flatten().tolist()
        assert constraint.advance(rng.choice(allowed))
    constraint.rollback(4)
    assert torch.equal(torch.isfinite(constraint.mask(torch.zeros(VOCAB))), before)


def test_the_batch_masker_narrows_each_row_as_its_own_mask_does():
    # Each with one token more than its closing: no token may grow the closing.
    states = [(b'{"abc": [1, ', 4), (b'{"k": "x', 3), (b"", 3), (b'{"a": {"b": ', 4)]

    def replayed(text: bytes, budget: int) -> TokenConstraint:
        constraint = TokenConstraint(GRAMMAR, VOCAB, TABLE)
        constraint.fit(budget + len(text))
        for byte in text:
            constraint.accept(byte)
        return constraint

    logits = torch.randn(len(states), VOCAB, generator=torch.Generator().manual_seed(0))
    batched = logits.clone()
    BatchMasker().mask_rows(batched, list(range(len(states))), [replayed(*s) for s in states])
    narrowed = 0
    for row, (text, budget) in enumerate(states):
        alone = torch.isfinite(replayed(text, budget).mask(logits[row]))
        assert torch.equal(torch.isfinite(batched[row]), alone), text
        grammar_only = TokenConstraint(GRAMMAR, VOCAB)
        assert all(grammar_only.advance(byte) for byte in text)
        narrowed += int(alone.sum() < torch.isfinite(grammar_only.mask(logits[row])).sum())
    assert narrowed == len(states)  # each budget is tight enough to forbid something the grammar allows


def test_at_the_end_of_the_budget_only_the_closing_is_left():
    constraint = TokenConstraint(GRAMMAR, VOCAB, TABLE)
    constraint.fit(len(b'{"ab') + len(b'": 0}'))
    for byte in b'{"ab':
        constraint.accept(byte)
    allowed = torch.isfinite(constraint.mask(torch.zeros(VOCAB))).nonzero().flatten().tolist()
    assert [PIECES[t] for t in allowed] == [b'"']


def test_the_grammar_takes_only_characters_a_utf8_decoder_reads():
    assert grammatical('{"\u00e9\ud7ff\U0010ffff": 1}'.encode())
    for encoded in (b"\xed\xa0\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\xc0\x80", b"\x80"):
        assert not grammatical(b'{"' + encoded + b'": 1}'), encoded

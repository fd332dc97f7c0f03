"""The json_object grammar: a JSON object whose numbers a double holds. Python's `json` module is the
oracle: it writes the texts (any nesting, strings, numbers) and reads their number literals back; the
grammar must accept a text exactly when each literal has at most 15 digits and a 2-digit exponent, and
each accepted literal must come back unchanged from a double (`decimal` compares the values)."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import xgrammar
from hypothesis import given, settings
from hypothesis import strategies as st

from gufo.engine.constraint import JSON_OBJECT, TokenConstraint

BYTES = 256  # one token per byte, then the end-of-generation token
INFO = xgrammar.TokenizerInfo(
    [bytes([b]) for b in range(BYTES)] + [b""], vocab_size=BYTES + 1, stop_token_ids=[BYTES]
)
GRAMMAR = xgrammar.GrammarCompiler(INFO, max_threads=1).compile_grammar(
    xgrammar.Grammar.from_ebnf(JSON_OBJECT)
)


def accepted(text: str) -> bool:
    """Every byte of `text` and then the end of generation get through a matcher of the grammar."""
    constraint = TokenConstraint(GRAMMAR, BYTES + 1)
    return all(constraint.advance(byte) for byte in text.encode()) and constraint.advance(BYTES)


def number_literals(text: str) -> list[str]:
    literals: list[str] = []

    def keep(literal: str) -> int:
        literals.append(literal)
        return 0

    json.loads(text, parse_int=keep, parse_float=keep)
    return literals


def within_the_bound(literal: str) -> bool:
    mantissa, _, exponent = literal.lower().lstrip("-").partition("e")
    return sum(c.isdigit() for c in mantissa) <= 15 and len(exponent.lstrip("+-")) <= 2


def survives_a_double(literal: str) -> bool:
    value = float(literal)
    return math.isfinite(value) and Decimal(format(value, ".15g")) == Decimal(literal)


numbers = st.one_of(
    st.integers(-(10**18), 10**18),
    st.floats(allow_nan=False, allow_infinity=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(float),
    st.floats(-1e4, 1e4).map(lambda x: round(x, 3)),
)
values = st.recursive(
    st.none() | st.booleans() | st.text(max_size=6) | numbers,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
objects = st.dictionaries(st.text(max_size=4), values, max_size=4)


@settings(max_examples=50)
@given(objects, st.booleans())
def test_accepts_exactly_the_objects_whose_numbers_a_double_holds(obj, ascii_only):
    text = json.dumps(obj, ensure_ascii=ascii_only)  # separators ", " and ": ", as the grammar writes
    literals = number_literals(text)
    assert accepted(text) == all(within_the_bound(literal) for literal in literals), text
    if accepted(text):
        assert all(survives_a_double(literal) for literal in literals), text


def test_the_bounds_by_hand():
    assert accepted('{"count": 999999999999999}') and not accepted('{"count": 1000000000000000}')
    assert accepted('{"x": -0.12345678901234, "y": 1.5e-99}') and not accepted('{"x": 0.123456789012345}')
    assert not accepted('{"x": 1e100}') and not accepted('{"x": 01}') and not accepted("[1]")
    assert not accepted('{"x":1}') and not accepted('{"x": "a\nb"}')  # one line, json_schema's separators

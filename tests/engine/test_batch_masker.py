"""BatchMasker: one batched fill and apply of several requests' grammar masks equals, row by row, what
xgrammar's matcher accepts. The oracle is `accept_token` on a matcher replayed to the same state: a token
survives the mask exactly when the grammar accepts it next. A row's filled mask is reused only while its
state stands: after a token is accepted, `mask` fills it again."""

from __future__ import annotations

import torch
import xgrammar

from gufo.engine.constraint import JSON_OBJECT, BatchMasker, TokenConstraint

BYTES = 256  # one token per byte, then the end-of-generation token
VOCAB = BYTES + 1
INFO = xgrammar.TokenizerInfo(
    [bytes([b]) for b in range(BYTES)] + [b""], vocab_size=VOCAB, stop_token_ids=[BYTES]
)
GRAMMAR = xgrammar.GrammarCompiler(INFO, max_threads=1).compile_grammar(
    xgrammar.Grammar.from_ebnf(JSON_OBJECT)
)
PREFIXES = ['{"a": ', "", '{"k": [1, 2', '{"s": "x']  # each row's text so far


def replayed(prefix: str) -> TokenConstraint:
    constraint = TokenConstraint(GRAMMAR, VOCAB)
    assert all(constraint.advance(byte) for byte in prefix.encode())
    return constraint


def allowed(prefix: str) -> torch.Tensor:
    """The oracle: which tokens the grammar accepts after `prefix` (each tried on a fresh replay)."""
    return torch.tensor([replayed(prefix).advance(token) for token in range(VOCAB)])


def test_rows_masked_in_one_batch_keep_exactly_the_tokens_the_grammar_accepts():
    logits = torch.randn(len(PREFIXES) + 1, VOCAB, generator=torch.Generator().manual_seed(0))
    original = logits.clone()
    rows = [0, 2, 3, 4]  # row 1 is a request without a grammar
    prefixes = [PREFIXES[0], PREFIXES[2], PREFIXES[3], PREFIXES[1]]
    BatchMasker().mask_rows(logits, rows, [replayed(p) for p in prefixes])
    for row, prefix in zip(rows, prefixes, strict=True):
        keep = allowed(prefix)
        assert 0 < int(keep.sum()) < VOCAB
        assert torch.equal(logits[row][keep], original[row][keep])
        assert torch.isneginf(logits[row][~keep]).all()
    assert torch.equal(logits[1], original[1])


def test_a_filled_mask_serves_until_a_token_is_accepted():
    constraint = replayed(PREFIXES[0])
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    BatchMasker().mask_rows(logits.clone(), [0], [constraint])
    assert torch.equal(torch.isfinite(constraint.mask(logits[0])), allowed(PREFIXES[0]))
    constraint.accept(ord("1"))  # '{"a": 1'
    assert torch.equal(torch.isfinite(constraint.mask(logits[0])), allowed(PREFIXES[0] + "1"))
    assert constraint.advance(ord("}"))  # the state moves on: the mask must follow it
    assert torch.equal(torch.isfinite(constraint.mask(logits[0])), allowed(PREFIXES[0] + "1}"))

"""Speculative decoding: batch-invariant verification, KV rollback, the ngram proposer, and the
distribution of sampled speculation (chi-square against the target distribution)."""

from __future__ import annotations

import json
from collections.abc import Callable

import jsonschema
import pytest
import torch
from scripted_proposer import check_rejections_leave_plain_state
from tiny_model import VOCAB, write_tiny_model

from gufo.engine.constraint import GrammarCompiler, TokenConstraint
from gufo.engine.engine import Engine
from gufo.engine.sampling import Sampler, SamplingParams
from gufo.engine.speculative import (
    Draft,
    NgramProposer,
    SpeculativeParams,
    SpeculativeStats,
    Speculator,
    accept_or_resample,
    grammatical_prefix,
)
from gufo.kernels.decode import CpuDecodeLayer

pytestmark = pytest.mark.skipif(not CpuDecodeLayer.available(), reason="needs AVX2 and a C compiler")

GREEDY = SamplingParams(temperature=0.0)
PLAIN = dict(top_k=0, top_p=1.0, min_p=0.0)  # sampling from the whole softmax


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real_engine(request) -> Engine:
    return Engine(request.param, context=256)


def test_verification_logits_equal_decode_logits(real_engine):
    """The one-pass verification of several tokens gives each exactly the logits of a decode step
    (also past the kernel's 16-token chunk), so greedy choices cannot differ from plain decoding."""
    engine = real_engine
    prompt = list(range(200, 230))
    engine.prefill(prompt)
    tokens = [5, 77, 1234, 9, 42, 31, 8, 200, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    sequential = torch.stack([engine.decode(t, len(prompt) + i) for i, t in enumerate(tokens)])
    for count in (1, 2, 7, len(tokens)):
        verified = engine.decode_tokens(tokens[:count], len(prompt))
        assert torch.equal(verified, sequential[:count]), count


def cache_prefix(engine: Engine, length: int) -> list[torch.Tensor]:
    cache = engine.cache
    return [t.clone() for layer in range(len(cache.keys)) for t in cache.entries(layer, 0, length)]


@pytest.mark.parametrize("model", ["smollm2-135m", "tiny-gemma3-window"])
def test_rejected_drafts_leave_the_cache_of_plain_decoding(model, tmp_path):
    """Acceptance 3 (also sliding-window layers): drafts rejected at every position, then the valid
    cache prefix equals a run that never drafted, bit for bit."""
    if model.startswith("tiny"):
        model = write_tiny_model(tmp_path / "gemma3.gguf", "gemma3")
    check_rejections_leave_plain_state(Engine(model, context=128), cache_prefix, fill_with_nan)


def fill_with_nan(engine: Engine) -> None:
    for layer in (*engine.cache.keys, *engine.cache.values):
        layer.fill_(float("nan"))  # nothing from the plain run may survive


def test_ngram_proposer_follows_the_longest_recent_match():
    sampler = Sampler(GREEDY)
    proposer = NgramProposer(SpeculativeParams("ngram", draft_max=3, draft_min=1, ngram_min=2))
    # "1 2 3" occurred twice; the most recent earlier occurrence is followed by 9 8
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 1, 2, 3], 10, sampler).tokens == [9, 8, 1]
    assert proposer.propose([1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 1, 2, 3], 2, sampler).tokens == [9, 8]
    assert proposer.propose([5, 6, 7, 8], 10, sampler).tokens == []  # no repeat
    short = NgramProposer(SpeculativeParams("ngram", draft_max=8, draft_min=3, ngram_min=2))
    # a match overlapping the end continues its period
    assert short.propose([4, 5, 6, 4, 5], 10, sampler).tokens == [6, 4, 5, 6, 4, 5, 6, 4]
    assert short.propose([4, 5, 6, 7, 4, 5, 6], 5, sampler).tokens == [7, 4, 5, 6, 7]
    assert short.propose([3, 9, 9, 9], 4, sampler).tokens == [9, 9, 9, 9]
    assert short.propose([4, 5, 9, 4, 5], 2, sampler).tokens == []  # below --draft-min


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of observed counts against probabilities (categories expecting < 5 are pooled)."""
    counts, probs = counts.double(), probs.double()
    expected = probs * counts.sum()
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was drawn"
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    wanted = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = wanted > 0
    statistic = ((observed - wanted).square() / wanted)[keep].sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), statistic / 2))


Rule = Callable[[torch.Tensor, torch.Tensor | None, int, torch.Generator], tuple[int, bool]]


def wrong_rule(p, q, drafted, generator):
    """A plausible bug: on rejection, draw from p instead of the residual max(p - q, 0)."""
    token, kept = accept_or_resample(p, q, drafted, generator)
    return (token, kept) if kept else (int(torch.multinomial(p, 1, generator=generator)), False)


def speculative_counts(rule: Rule, p: torch.Tensor, q: torch.Tensor | None, draws: int, seed: int):
    """Output token counts of `draws` speculative steps: draft from q (or always token 0 for a point
    mass), then the rule decides."""
    generator = torch.Generator().manual_seed(seed)
    proposal = q if q is not None else torch.nn.functional.one_hot(torch.tensor(0), p.numel()).double()
    drafts = torch.multinomial(proposal, draws, replacement=True, generator=generator)
    counts = torch.zeros(p.numel())
    for drafted in drafts.tolist():
        counts[rule(p, q, drafted, generator)[0]] += 1
    return counts


DRAWS = 24000


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model-q", "ngram-point-mass"])
def test_accept_rule_reproduces_the_target_distribution(point_mass):
    """Acceptance 2: speculative sampling's output frequencies cannot be told from the target's, and
    the wrong rule is caught by the same test."""
    torch.manual_seed(3)
    p = torch.softmax(torch.randn(12, dtype=torch.float64) * 1.5, -1)
    q = None if point_mass else torch.softmax(torch.randn(12, dtype=torch.float64) * 1.5, -1)
    good = chi_square_pvalue(speculative_counts(accept_or_resample, p, q, DRAWS, seed=1), p)
    bad = chi_square_pvalue(speculative_counts(wrong_rule, p, q, DRAWS, seed=1), p)
    assert good > 1e-3
    assert bad < 1e-6


def test_sampled_speculation_end_to_end_matches_the_model(tmp_path):
    """Sampled generation with ngram drafts on a tiny model (3 tokens, so the second one is a verified
    draft or its replacement): the second token's frequencies match its
    exact marginal sum_t1 p(t1) p(t2 | t1), computed by plain decoding."""
    engine = Engine(write_tiny_model(tmp_path / "tiny.gguf"), context=64)
    prompt = [1, 5, 6, 7, 5, 6, 7, 5, 6, 7, 5, 6]
    first = torch.softmax(engine.prefill(prompt).double(), -1)
    marginal = torch.zeros(VOCAB, dtype=torch.float64)
    for t1 in range(VOCAB):
        engine.prefill(prompt)
        marginal += first[t1] * torch.softmax(engine.decode(t1, len(prompt)).double(), -1)
    speculator = Speculator(engine, NgramProposer(SpeculativeParams("ngram", draft_max=3, ngram_min=1)))
    counts, total = torch.zeros(VOCAB), SpeculativeStats()
    for seed in range(1200):  # the accept/resample rule itself is tested with 24000 draws above
        params = SamplingParams(temperature=1.0, seed=seed, **PLAIN)
        counts[speculator.generate(prompt, 3, params, stop_at_eog=False).generated_ids[1]] += 1
        total.add(speculator.stats)
    assert 0 < total.accepted < total.drafted  # both kept and rejected drafts took part
    assert chi_square_pvalue(counts, marginal) > 1e-3


# The tiny vocabulary's pieces are "t0".."t28" (ids 3..31). This grammar is pairs: id 5 or 6, then id 8
# or 12 ("t25" is "t2" and then "5", which nothing continues), end-of-generation (id 2) after a pair.
TINY_GRAMMAR = 'root ::= (("t2" | "t3") ("t5" | "t9"))+'
FIRST, SECOND, EOG = [5, 6], [8, 12], 2


def tiny_grammar(engine: Engine) -> Callable[[], TokenConstraint]:
    """A fresh matcher of TINY_GRAMMAR per call (compiled once)."""
    compiler = GrammarCompiler(engine.tokenizer)
    grammar = compiler.grammar(TINY_GRAMMAR)
    return lambda: TokenConstraint(grammar, compiler.vocab_size)


def allowed_ids(constraint: TokenConstraint) -> list[int]:
    return torch.isfinite(constraint.mask(torch.zeros(VOCAB))).nonzero().flatten().tolist()


def keeps_the_pairs(tokens: list[int]) -> bool:
    """The hand-written oracle of TINY_GRAMMAR over a (possibly unfinished) output."""
    body = tokens[:-1] if tokens[-1:] == [EOG] and len(tokens) % 2 == 1 else tokens
    return all(t in FIRST for t in body[0::2]) and all(t in SECOND for t in body[1::2])


def test_a_draft_ends_at_the_first_token_the_grammar_rejects(tmp_path):
    engine = Engine(write_tiny_model(tmp_path / "tiny.gguf"), context=64)
    constraint = tiny_grammar(engine)()
    assert allowed_ids(constraint) == FIRST
    assert grammatical_prefix(Draft([5, 12, 6, 6, 8]), constraint).tokens == [5, 12, 6]
    assert grammatical_prefix(Draft([12, 5]), constraint).tokens == []
    q = [torch.full((VOCAB,), 1 / VOCAB, dtype=torch.float64)] * 4
    kept = grammatical_prefix(Draft([5, 8, EOG, 6], q), constraint)
    assert kept.tokens == [5, 8, EOG] and len(kept.probs) == 3  # nothing after the end
    assert allowed_ids(constraint) == FIRST  # the matcher is where it was


def masked_softmax(logits: torch.Tensor, allowed: list[int]) -> torch.Tensor:
    """The hand-computed oracle: the target's softmax restricted to the grammar's tokens, renormalised."""
    probs = torch.zeros(VOCAB, dtype=torch.float64)
    probs[allowed] = torch.softmax(logits.double()[allowed], -1)
    return probs


def test_constrained_sampled_speculation_matches_the_masked_model(tmp_path):
    """Sampled ngram speculation under a grammar, on the tiny model: drafts the grammar rejects are cut,
    the rest verified against the masked, renormalised target, so every output keeps the grammar and
    the second token's frequencies match sum_t1 p'(t1) p'(t2 | t1), p' the model's distribution
    restricted to the tokens the grammar allows there."""
    engine = Engine(write_tiny_model(tmp_path / "tiny.gguf"), context=64)
    prompt = [1, 5, 12, 6, 8, 5, 12, 6, 8, 6, 12, 5, 12]  # ngram drafts of valid pairs, some cut
    first = masked_softmax(engine.prefill(prompt), FIRST)
    marginal = torch.zeros(VOCAB, dtype=torch.float64)
    for t1 in FIRST:
        engine.prefill(prompt)
        marginal += first[t1] * masked_softmax(engine.decode(t1, len(prompt)), SECOND)
    speculator = Speculator(engine, NgramProposer(SpeculativeParams("ngram", draft_max=3, ngram_min=1)))
    counts, total, constraint = torch.zeros(VOCAB), SpeculativeStats(), tiny_grammar(engine)
    for seed in range(400):  # CI time: the accept rule itself is tested with 24000 draws above
        params = SamplingParams(temperature=1.0, seed=seed, **PLAIN)
        result = speculator.generate(prompt, 4, params, constraint=constraint())
        assert keeps_the_pairs(result.generated_ids), result.generated_ids
        counts[result.generated_ids[1]] += 1
        total.add(speculator.stats)
    assert 0 < total.accepted < total.drafted
    assert chi_square_pvalue(counts, marginal) > 1e-3


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PEOPLE = 'Person: {"name": "Ada", "age": 36}\nPerson: {"name": "Ada", "age": 36}\nPerson: '


def test_constrained_greedy_speculation_equals_constrained_plain_decoding(real_engine):
    """Under a JSON schema, greedy ngram speculation gives plain constrained decoding's tokens (whose
    text the schema validates, `jsonschema` the oracle) with drafts kept, those past the object's end
    cut by the grammar."""
    engine = real_engine
    compiler = GrammarCompiler(engine.tokenizer)
    grammar = compiler.json_schema(PERSON)
    prompt = engine.tokenizer.encode(PEOPLE, add_special=True, parse_special=False)
    plain = engine.generate(prompt, 20, GREEDY, constraint=TokenConstraint(grammar, compiler.vocab_size))
    assert plain.stopped_by == "eog"
    jsonschema.validate(json.loads(engine.tokenizer.decode(plain.generated_ids[:-1])), PERSON)
    speculator = Speculator(engine, NgramProposer(SpeculativeParams("ngram", draft_max=4)))
    constraint = TokenConstraint(grammar, compiler.vocab_size)
    assert speculator.generate(prompt, 20, GREEDY, constraint=constraint).generated_ids == plain.generated_ids
    assert speculator.stats.accepted > 0

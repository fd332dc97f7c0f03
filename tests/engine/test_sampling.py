"""Sampler behaviour against closed-form expectations (softmax arithmetic, llama.cpp's chain order)."""

from __future__ import annotations

import math
from collections import Counter

import torch

from gufo.engine.sampling import Sampler, SamplingParams
from gufo.engine.trace import token_trace_hash


def draw(params: SamplingParams, logits: list[float], n: int, history: list[int] | None = None) -> Counter:
    sampler = Sampler(params)
    vector = torch.tensor(logits)
    return Counter(sampler(vector, history or []) for _ in range(n))


def test_greedy_ties_go_to_lowest_id():
    sampler = Sampler(SamplingParams(temperature=0.0))
    assert sampler(torch.tensor([0.0, 3.0, 1.0, 3.0])) == 1


def test_temperature_matches_softmax_frequencies():
    logits, temp, n = [1.0, 2.0, 0.5, -1.0], 0.7, 20000
    params = SamplingParams(temperature=temp, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    counts = draw(params, logits, n)
    weights = [math.exp(v / temp) for v in logits]
    for token, weight in enumerate(weights):
        expected = weight / sum(weights)
        assert abs(counts[token] / n - expected) < 4 * math.sqrt(expected * (1 - expected) / n) + 1e-3


def test_top_k_top_p_and_min_p_limit_the_support():
    logits = [4.0, 3.0, 2.0, 1.0, 0.0]
    assert set(draw(SamplingParams(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=0), logits, 500)) <= {
        0,
        1,
    }
    # softmax probabilities: 0.636, 0.234, 0.086, ...; top-p 0.8 keeps the first two (0.636 < 0.8 <= 0.870)
    assert set(draw(SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=0), logits, 500)) == {
        0,
        1,
    }
    # min-p 0.2 keeps tokens with p >= 0.2 * 0.636 = 0.127: ids 0 and 1
    assert set(draw(SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=0), logits, 500)) == {
        0,
        1,
    }


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    sampler = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0))
    # id 0 (logit 3 -> 1.5) falls behind id 1 (2.0); id 2 (-1 -> -2) stays last
    assert sampler(torch.tensor([3.0, 2.0, -1.0]), history=[0, 2]) == 1


def test_seed_makes_sampling_reproducible():
    params = SamplingParams(temperature=1.0, seed=42)
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    a, b = Sampler(params), Sampler(params)
    draws = [a(logits) for _ in range(20)]
    assert draws == [b(logits) for _ in range(20)]
    assert len(set(draws)) > 1  # really sampling, not collapsing to the argmax


def test_token_trace_hash_is_sha256_of_little_endian_uint32():
    import hashlib

    ids = [1, 256, 70000]
    raw = b"".join(i.to_bytes(4, "little") for i in ids)
    assert token_trace_hash(ids) == hashlib.sha256(raw).hexdigest()

"""Sampler behaviour against closed-form expectations (softmax arithmetic, llama.cpp's chain order)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gufo.engine.sampling import QueuedTokens, Sampler, SamplingParams, first_max_queued, greedy_split
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


LOWEST = torch.finfo(torch.float32).min
SPECIAL = [float("nan"), float("-inf"), float("inf"), LOWEST, 0.0, -0.0, 1.0, 2.0]  # ties and odd values


def first_max_by_hand(row: list[float]) -> int:
    """The greedy rule in plain Python: the lowest id of the largest value, NaN below everything and
    -inf equal to the lowest float (what nan_to_num(nan=-inf, posinf=inf) makes of them)."""
    rank = [float("-inf") if math.isnan(v) else LOWEST if v == float("-inf") else v for v in row]
    return rank.index(max(rank))


def greedy_rows_agree(rows: list[list[float]], device: str) -> None:
    logits = torch.tensor(rows, device=device)
    plain = [i % 3 != 1 for i in range(len(rows))]  # every third row wants its logits on the host
    tokens, host = greedy_split(logits, plain)
    for i, row in enumerate(rows):
        if plain[i]:
            assert host[i] is None
            assert (
                tokens[i]
                == first_max_by_hand(row)
                == Sampler(SamplingParams(temperature=0.0))(torch.tensor(row))
            ), row
        else:
            assert tokens[i] is None and host[i].device.type == "cpu"
            torch.testing.assert_close(host[i], torch.tensor(row), rtol=0, atol=0, equal_nan=True)


@given(st.lists(st.lists(st.sampled_from(SPECIAL), min_size=5, max_size=5), min_size=1, max_size=7))
def test_batched_greedy_rows_pick_what_the_host_sampler_picks(rows):
    greedy_rows_agree(rows, "cpu")


def test_greedy_split_ties_and_odd_rows():
    rows = [
        [0.0, 3.0, 1.0, 3.0, 3.0],  # a tie: the lowest id
        [float("nan"), 1.0, 1.0, 0.0, 0.0],  # NaN counts as -inf
        [float("nan"), float("-inf"), float("nan"), float("-inf"), float("nan")],  # -inf above NaN
        [float("-inf"), LOWEST, float("-inf"), float("-inf"), float("-inf")],  # -inf ties the lowest float
        [float("inf"), 5.0, float("inf"), 1.0, 0.0],
        [-0.0, 0.0, -1.0, -2.0, -3.0],  # -0.0 ties 0.0
    ]
    greedy_rows_agree(rows, "cpu")
    greedy_rows_agree(rows * 2, "cpu")  # the plain and host rows change places


@pytest.mark.gpu
def test_greedy_split_on_the_gpu_picks_what_the_host_sampler_picks():
    rows = torch.randn(20, 1000, generator=torch.Generator().manual_seed(0))
    rows[:, 7] = rows[:, 700] = rows.max() + 1  # tied maxima
    rows[3, 7] = float("nan")
    greedy_rows_agree(rows.tolist(), "cuda")


@pytest.mark.gpu
def test_queued_first_maxima_on_the_gpu_are_the_host_rule():
    """`first_max_queued` (nothing read on the host) on rows with ties, NaN and infinities: the plain
    Python rule, read back through `QueuedTokens`."""
    rows = [
        [0.0, 3.0, 1.0, 3.0, 3.0],
        [float("nan"), 1.0, 1.0, 0.0, 0.0],
        [float("nan"), float("-inf"), float("nan"), float("-inf"), float("nan")],
        [float("-inf"), LOWEST, float("-inf"), float("-inf"), float("-inf")],
        [float("inf"), 5.0, float("inf"), 1.0, 0.0],
        [-0.0, 0.0, -1.0, -2.0, -3.0],
    ]
    picked = QueuedTokens(first_max_queued(torch.tensor(rows, device="cuda")))
    assert picked.ids.device.type == "cuda"
    assert picked.tolist() == [first_max_by_hand(row) for row in rows]


def test_plain_greedy_is_greedy_with_nothing_that_changes_or_masks_the_logits():
    class Mask:
        def mask(self, logits):
            return logits

        def accept(self, token):
            pass

    plain = [
        (SamplingParams(temperature=0.0), True),
        (SamplingParams(temperature=0.0, repeat_penalty=1.5, repeat_last_n=0), True),  # a window of nothing
        (SamplingParams(temperature=0.8), False),
        (SamplingParams(temperature=0.0, repeat_penalty=1.5), False),
        (SamplingParams(temperature=0.0, presence_penalty=0.5), False),
        (SamplingParams(temperature=0.0, frequency_penalty=0.5), False),
        (SamplingParams(temperature=0.0, logit_bias={2: 1.0}), False),
    ]
    assert [Sampler(p).plain_greedy for p, _ in plain] == [is_plain for _, is_plain in plain]
    assert not Sampler(SamplingParams(temperature=0.0), constraint=Mask()).plain_greedy
    # what plain means: the penalties of the others move this row's choice (history: id 1 twice)
    logits, history = torch.tensor([0.0, 2.0, 1.9, 0.5, 0.0]), [1, 1]
    for params, is_plain in plain:
        if params.greedy:
            assert (Sampler(params)(logits, history) == 1) == is_plain, params

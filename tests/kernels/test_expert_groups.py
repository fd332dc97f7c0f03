"""kernels.expert_groups against plain Python: the sorted order, per-expert counts and starts, the row
tiles of each expert, and the per-token combine of the sorted rows."""

from __future__ import annotations

import pytest
import torch

from gufo.kernels.expert_groups import (
    NO_EXPERT,
    TILE_ROWS,
    group_assignments,
    max_tiles,
    per_expert,
    tile_rows,
    weighted_slots,
)

N_EXPERTS, K = 8, 2


def routed(tokens: int, seed: int) -> torch.Tensor:
    """[tokens, K] distinct experts per token, expert 3 chosen by the first 20 tokens (several tiles)."""
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.stack([torch.randperm(N_EXPERTS, generator=gen)[:K] for _ in range(tokens)])
    chosen[:20, 0] = torch.where(chosen[:20, 1] == 3, 5, 3)
    return chosen


@pytest.mark.parametrize("block_m", TILE_ROWS)
@pytest.mark.parametrize("tokens", [1, 37])
def test_groups_match_python(tokens, block_m):
    chosen = routed(tokens, tokens)
    groups = group_assignments(chosen, N_EXPERTS, block_m)
    flat = chosen.reshape(-1).tolist()
    order = sorted(range(len(flat)), key=lambda a: (flat[a], a))  # stable by expert
    assert groups.order.tolist() == order
    assert [order[i] for i in groups.inverse.tolist()] == list(range(len(flat)))
    assert groups.tokens.tolist() == [a // K for a in order]
    counts = [flat.count(e) for e in range(N_EXPERTS)]
    assert groups.counts.tolist() == counts
    assert groups.starts.tolist() == [sum(counts[:e]) for e in range(N_EXPERTS)]
    want = []
    for e in range(N_EXPERTS):
        first, end = sum(counts[:e]), sum(counts[: e + 1])
        want += [[e, row, end] for row in range(first, end, block_m)]
    tiles = groups.tiles.tolist()
    assert len(tiles) == max_tiles(len(flat), N_EXPERTS, block_m) >= len(want)
    assert tiles == want + [[NO_EXPERT, 0, 0]] * (len(tiles) - len(want))
    assert groups.tiles.dtype == torch.int32


def test_per_expert_takes_each_experts_rows():
    chosen = routed(37, 1)
    groups = group_assignments(chosen, N_EXPERTS, 16)
    rows = chosen.reshape(-1)[groups.order]  # each row holds its own expert
    for e, part in per_expert(rows, groups):
        assert part.tolist() == [e] * int(groups.counts[e])


def test_sorted_rows_back_in_token_order_and_weighted():
    chosen = routed(37, 2)
    groups = group_assignments(chosen, N_EXPERTS, 16)
    values = torch.randn(chosen.numel(), 5, dtype=torch.float64)  # one row per assignment, unsorted
    weights = torch.rand(37, K, dtype=torch.float64)
    got = weighted_slots(values[groups.order][groups.inverse], weights)
    want = torch.stack([sum(weights[t, s] * values[t * K + s] for s in range(K)) for t in range(37)])
    assert torch.allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("assignments", "want"), [(8, 16), (4096, 16), (8192, 32), (16384, 64), (10**6, 64)])
def test_tile_rows_follow_the_average_expert(assignments, want):
    assert tile_rows(assignments, 256) == want

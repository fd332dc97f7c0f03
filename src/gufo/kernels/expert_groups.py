"""The token-expert assignments of a prefill grouped by expert, built on the device (no host read): the
sorted order of the assignments, each expert's first row and row count in that order, and the row tiles
a grouped product runs over (each tile BLOCK_M rows of one expert, the tiles of an expert one after the
other, the experts in order).

Assignment a = token * k + slot (the router's top-k, flattened). Sorted row i is assignment order[i];
`inverse` maps each assignment back to its sorted row, so a per-row result is read back per token and
slot (a gather, then a sum over the k slots in fixed order: deterministic, no scatter-add).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

# one tile's row of `ExpertGroups.tiles`: its expert (NO_EXPERT past the last tile), first and end row
TILE_FIELDS = 3
NO_EXPERT = -1


@dataclass(frozen=True)
class ExpertGroups:
    n_experts: int
    n_used: int  # k: assignments per token
    block_m: int  # rows per tile
    order: torch.Tensor  # int64 [A]: the assignment of each sorted row
    inverse: torch.Tensor  # int64 [A]: the sorted row of each assignment
    starts: torch.Tensor  # int64 [n_experts]: each expert's first sorted row
    counts: torch.Tensor  # int64 [n_experts]: each expert's rows
    tiles: torch.Tensor  # int32 [max_tiles(A, ...), TILE_FIELDS]: expert, first row, end row

    @property
    def tokens(self) -> torch.Tensor:
        """int64 [A]: the token of each sorted row."""
        return self.order // self.n_used


TILE_ROWS = (16, 32, 64)  # the tile heights grouped products take


def tile_rows(assignments: int, n_experts: int) -> int:
    """Rows per tile for `assignments` rows over n_experts: the average rows of an expert, rounded up
    to a power of two within TILE_ROWS (from the shapes only, no host read of the counts)."""
    average = -(-assignments // n_experts)
    return min(max(1 << (average - 1).bit_length(), TILE_ROWS[0]), TILE_ROWS[-1])


def max_tiles(assignments: int, n_experts: int, block_m: int) -> int:
    """Most tiles `assignments` rows take, grouped by expert: each expert with rows adds at most one
    partial tile to the full ones, so the grid is sized without reading the counts."""
    return -(-assignments // block_m) + min(n_experts, assignments)


def group_assignments(chosen: torch.Tensor, n_experts: int, block_m: int) -> ExpertGroups:
    """chosen [tokens, k] (int64 expert ids, on any device) -> their `ExpertGroups`, in tiles of
    block_m rows."""
    experts = chosen.reshape(-1)
    assignments, device = experts.shape[0], experts.device
    order = experts.argsort(stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(assignments, device=device))
    ids = torch.arange(n_experts, device=device, dtype=experts.dtype)
    ranked = experts[order]
    # searchsorted on the sorted ids, not bincount: CUDA's bincount reads the largest id on the host
    starts = torch.searchsorted(ranked, ids)
    ends = torch.searchsorted(ranked, ids, right=True)
    counts = ends - starts
    per_expert = (counts + block_m - 1) // block_m
    last_tile = per_expert.cumsum(0)  # one past each expert's last tile
    tile = torch.arange(max_tiles(assignments, n_experts, block_m), device=device)
    owner = torch.searchsorted(last_tile, tile, right=True)
    valid = owner < n_experts
    owner = owner.clamp(max=n_experts - 1)
    first = starts[owner] + (tile - (last_tile[owner] - per_expert[owner])) * block_m
    tiles = torch.stack(
        [
            torch.where(valid, owner, NO_EXPERT),
            torch.where(valid, first, 0),
            torch.where(valid, ends[owner], 0),
        ],
        1,
    )
    return ExpertGroups(
        n_experts, chosen.shape[-1], block_m, order, inverse, starts, counts, tiles.to(torch.int32)
    )


def weighted_slots(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per assignment results y [tokens * k, cols] (token-major) -> per token [tokens, cols], each
    token's k rows weighted by weights [tokens, k] and summed over the slots in order."""
    tokens, k = weights.shape
    return (y.reshape(tokens, k, -1) * weights[..., None].to(y.dtype)).sum(1)


def per_expert(x: torch.Tensor, groups: ExpertGroups) -> Iterator[tuple[int, torch.Tensor]]:
    """(expert, its rows of x) for each expert with rows, x sorted as `groups` orders the assignments:
    for products that run one expert at a time (the counts read on the host)."""
    for e, rows in enumerate(x.split(groups.counts.tolist())):
        if rows.shape[0]:
            yield e, rows

"""Where the tokens of a multi-token decode call sit in the cache: the position types kernels take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenPositions:
    """Consecutive tokens from `start` that each attend exactly as a one-token decode step at its
    position would (same op, same cache span): batch-invariant speculative verification on GPUs."""

    start: int


@dataclass(frozen=True)
class RowPositions:
    """One token per row, row i at `positions[i]` of cache slot `slots[i]`: a decode step of several
    sequences at once (kernels that take it read each weight once for all rows)."""

    slots: tuple[int, ...]
    positions: tuple[int, ...]

"""Which captured graph a decode step of several sequences replays, and what fills its spare rows.

Every row count up to EXACT_ROWS has a graph of its own. Past it (a route whose products keep each row's
numbers up to 64 rows: the tensor-core int8 rows) counts round up to a multiple of BUCKET_STEP, so at
most three more graphs are captured: 17..32 rows replay the 32-row graph, and so on. The rows a bucket
has beyond the step's go to a scratch slot of the cache (`KVCache.scratch_slot`) at position 0: the
slot holds no pages, so they write and read only the trash page's first entry, and their logits are
dropped. A row's numbers do not depend on how many rows share its replay, so padding changes no real
row.
"""

from __future__ import annotations

from collections.abc import Sequence

EXACT_ROWS = 16  # row counts that each have their own graph (the vector products' row limit)
BUCKET_STEP = 16  # the buckets past EXACT_ROWS: multiples of this (the tensor-core rows' tile height)


def buckets(max_rows: int) -> tuple[int, ...]:
    """The row counts graphs are captured for, for steps of up to `max_rows` rows: 1..EXACT_ROWS, then
    the multiples of BUCKET_STEP up to `max_rows` (and `max_rows` itself, the largest step)."""
    exact = tuple(range(1, min(max_rows, EXACT_ROWS) + 1))
    wide = tuple(range(EXACT_ROWS + BUCKET_STEP, max_rows + 1, BUCKET_STEP))
    if max_rows > EXACT_ROWS and max_rows not in wide:
        wide = (*wide, max_rows)
    return exact + wide


def bucket(n_rows: int, max_rows: int) -> int:
    """The graph's row count for a step of `n_rows` rows (1..max_rows): the smallest bucket that holds
    them."""
    if not 0 < n_rows <= max_rows:
        raise ValueError(f"{n_rows} rows in one graph step (1 to {max_rows})")
    return next(size for size in buckets(max_rows) if size >= n_rows)


def padded(
    tokens: Sequence[int], positions: Sequence[int], slots: Sequence[int], size: int, scratch_slot: int | None
) -> tuple[list[int], list[int], list[int]]:
    """The step's rows, then `size - len(tokens)` padding rows (token 0 at position 0 of
    `scratch_slot`); raises when padding is needed and there is no scratch slot."""
    spare = size - len(tokens)
    if spare and scratch_slot is None:
        raise ValueError(f"{len(tokens)} rows padded to {size} need a scratch slot, and the cache has none")
    return (
        [*tokens, *[0] * spare],
        [*positions, *[0] * spare],
        [*slots, *[scratch_slot] * spare],
    )

"""Which captured prefill graph a chunk replays (`gufo.engine.graphs.prefill`), or whether it runs eagerly.

A chunk of n tokens (1..batch_size) replays the graphs of the smallest bucket that holds it: the powers
of two from MIN_BUCKET below batch_size, then batch_size itself (a server's full chunk replays unpadded).
Powers of two keep a padded chunk's rows under twice its own while a batch of 512 needs 6 sets of graphs
(capture time and graph memory at load); below MIN_BUCKET rows padding costs nothing measurable, the
products' tiles being 16 rows high. The GPU products change kernels at 16 and 64 rows
(`launch.MAX_BLOCK_M`, `rows_int8.MAX_TENSOR_ROWS`), which are bucket edges too, so a padded chunk of 4
tokens or more takes the kernels its own length would (below 4, vector kernels against tl.dot). The
bucket's rows past the chunk's write KV at the positions after it, so a chunk whose bucket would run
past the context runs eagerly instead.
"""

from __future__ import annotations

MIN_BUCKET = 16  # the smallest padded chunk: the tensor-core products' tile height
# A chunk longer than this takes the prefill route in every product alone (past the most rows any skinny
# route keeps: launch.MAX_TENSOR_ROWS, MAX_HALF_ROWS), so it may share a pass (Engine.packs_prefill)
PACKED_MIN_TOKENS = 64
# The fewest rows a pass of packed chunks replays: the smallest power of two past PACKED_MIN_TOKENS, so
# that every product of the pass takes the prefill route however few tokens it holds (on the fixed tiles
# a chunk of any length runs as such a pass: Engine.tiled_prefill)
PACK_MIN_ROWS = 2 * PACKED_MIN_TOKENS


def buckets(batch_size: int) -> tuple[int, ...]:
    """The chunk lengths graphs are captured for, for chunks of up to `batch_size` tokens."""
    sizes, size = [], MIN_BUCKET
    while size < batch_size:
        sizes.append(size)
        size *= 2
    return (*sizes, batch_size)


def bucket(n_tokens: int, batch_size: int) -> int:
    """The graphs' length for a chunk of `n_tokens` tokens (1..batch_size): the smallest bucket holding it."""
    if not 0 < n_tokens <= batch_size:
        raise ValueError(f"a prefill chunk of {n_tokens} tokens (1 to {batch_size})")
    return next(size for size in buckets(batch_size) if size >= n_tokens)


def replay_size(n_tokens: int, start: int, batch_size: int, context: int) -> int | None:
    """The bucket a chunk of `n_tokens` at position `start` replays, or None (eager) when the bucket's
    padding would write past the cache's `context` entries."""
    size = bucket(n_tokens, batch_size)
    return size if start + size <= context else None


def prepared_sizes(max_tokens: int, batch_size: int, context: int) -> tuple[int, ...]:
    """The buckets that chunks of up to `max_tokens` tokens replay (those that fit the context)."""
    last = bucket(min(max_tokens, batch_size), batch_size)
    return tuple(size for size in buckets(batch_size) if size <= last and size <= context)


def pack_bucket(n_tokens: int) -> int:
    """The graphs' length for a pass of packed chunks, `n_tokens` rows in all (`Engine.prefill_parts`):
    the smallest power of two holding them, at least PACK_MIN_ROWS (its padding rows write the trash
    page, so no bucket is bound by the context)."""
    if n_tokens <= 0:
        raise ValueError(f"a packed prefill pass of {n_tokens} tokens")
    return max(PACK_MIN_ROWS, 1 << (n_tokens - 1).bit_length())


def pack_sizes(min_tokens: int, max_tokens: int) -> tuple[int, ...]:
    """The buckets that packed passes of `min_tokens` to `max_tokens` rows replay."""
    first, last = pack_bucket(min_tokens), pack_bucket(max_tokens)
    return tuple(1 << i for i in range(first.bit_length() - 1, last.bit_length()))

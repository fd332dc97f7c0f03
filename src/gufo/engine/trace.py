"""Token traces: SHA-256 of generated ids as little-endian uint32, for parity checks across builds."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence


def token_trace_hash(ids: Sequence[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest()


def token_trace_line(ids: Sequence[int]) -> str:
    return f"[TokenTrace]: count={len(ids)} sha256={token_trace_hash(ids)}"

"""llama-bench's batch defaults and output formats, apart from the printers so that `gufo bench --help`
shows them without importing the engine."""

from __future__ import annotations

DEFAULT_N_BATCH = 2048  # logical batch: prompt tokens handed to the engine per call
DEFAULT_N_UBATCH = 512  # physical batch: prompt tokens per forward pass
FORMATS = ("md", "json", "jsonl", "csv")

"""Reference next-token distributions for `gufo quality`: recorded from a teacher-forced run, saved to a
compressed file, and loaded on another device, build or route to compare a candidate run against.

The token sequence is cut into chunks of `chunk` tokens, each evaluated from position 0 (like
llama-perplexity). Per stored position the file keeps the top-K logits (all of them when K covers the
vocabulary) and the log-sum-exp of the full row, so log-probabilities are exact for the kept ids and
the mass of the rest is known; plus the logit of the actual next token for perplexity.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gufo.engine.engine import Engine
from gufo.errors import BadInputError

FORMAT = "gufo-reference-logits-1"


def log_sum_exp(rows: torch.Tensor) -> torch.Tensor:
    """float64 log-sum-exp of each row [P, vocab] -> [P], the same bits for a row whatever the number of
    rows beside it and torch's thread count: torch's reduction splits one row across threads when there
    are fewer rows than threads (so a chunk's 1-row tail differed from the same row among many), numpy
    sums each row alone, pairwise, on one thread. The reference's `lse` and the candidate's both come
    from here, so a run compared with itself gives KL 0 and the same perplexity bit for bit."""
    values = rows.detach().to("cpu", torch.float64).numpy()
    top = values.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return torch.from_numpy((np.log(np.exp(values - top).sum(axis=-1)) + top[:, 0]).copy())


@dataclass
class ReferenceLogits:
    tokens: np.ndarray  # int64 [N], the whole evaluated sequence
    chunk: int  # tokens per independently evaluated window
    positions: np.ndarray  # int64 [P], indices into tokens whose next-token distribution is stored
    logits: np.ndarray  # float32 [P, K], descending per row (K == vocab_size: the full rows, in id order)
    ids: np.ndarray | None  # int32 [P, K] ids of `logits`; None when the rows are the full vocabulary
    lse: np.ndarray  # float64 [P], log-sum-exp of each full row
    next_logit: np.ndarray  # float32 [P], logit of the following token; NaN at a chunk's last token
    vocab_size: int
    meta: dict[str, object] = field(default_factory=dict)  # model, device, routes of the run

    @property
    def full(self) -> bool:
        return self.ids is None

    @classmethod
    def from_rows(
        cls,
        tokens: np.ndarray,
        chunk: int,
        positions: np.ndarray,
        rows: torch.Tensor,
        top_k: int,
        meta: dict[str, object] | None = None,
    ) -> ReferenceLogits:
        """Build from full logit rows [P, vocab] of `positions`; top_k 0 or >= vocab keeps everything."""
        rows = rows.float()
        vocab = rows.shape[-1]
        lse = log_sum_exp(rows)
        if 0 < top_k < vocab:
            kept, ids = torch.topk(rows, top_k, dim=-1)
            ids_array: np.ndarray | None = ids.to(torch.int32).numpy()
        else:
            kept, ids_array = rows, None
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        following = positions + 1
        has_next = (following < len(tokens)) & (following % chunk != 0)
        next_ids = torch.from_numpy(np.where(has_next, tokens[np.minimum(following, len(tokens) - 1)], 0))
        next_logit = rows.gather(1, next_ids[:, None])[:, 0].numpy()
        return cls(
            tokens=tokens,
            chunk=chunk,
            positions=positions,
            logits=kept.numpy(),
            ids=ids_array,
            lse=lse.numpy(),
            next_logit=np.where(has_next, next_logit, np.nan).astype(np.float32),
            vocab_size=vocab,
            meta=meta or {},
        )

    def save(self, path: Path) -> None:
        arrays = {
            "tokens": self.tokens,
            "positions": self.positions,
            "logits": self.logits,
            "lse": self.lse,
            "next_logit": self.next_logit,
            "header": np.array(
                json.dumps(
                    {"format": FORMAT, "chunk": self.chunk, "vocab_size": self.vocab_size, "meta": self.meta}
                )
            ),
        }
        if self.ids is not None:
            arrays["ids"] = self.ids
        try:
            with path.open("wb") as out:
                np.savez_compressed(out, **arrays)
        except OSError as err:
            raise BadInputError(f"--save-logits {path}: cannot write: {err.strerror}") from None

    @classmethod
    def load(cls, path: Path) -> ReferenceLogits:
        not_one = (
            f"--reference {path}: not a gufo reference logits file (`gufo quality --save-logits` writes one)"
        )
        try:
            with open(path, "rb") as handle:  # np.load would try another file as a pickle, and say so
                if not zipfile.is_zipfile(handle):
                    raise BadInputError(not_one)
            with np.load(path, allow_pickle=False) as data:
                header = json.loads(str(data["header"]))
                if header.get("format") != FORMAT:
                    raise ValueError(f"format {header.get('format')!r}, expected {FORMAT}")
                return cls(
                    tokens=data["tokens"],
                    chunk=int(header["chunk"]),
                    positions=data["positions"],
                    logits=data["logits"],
                    ids=data.get("ids"),
                    lse=data["lse"],
                    next_logit=data["next_logit"],
                    vocab_size=int(header["vocab_size"]),
                    meta=header.get("meta", {}),
                )
        except OSError as err:
            raise BadInputError(f"--reference {path}: cannot read: {err.strerror or err}") from None
        except (ValueError, KeyError, zipfile.BadZipFile) as err:
            raise BadInputError(f"{not_one}: {err}") from None


def chunk_logits(engine: Engine, tokens: np.ndarray, chunk: int) -> Iterator[tuple[int, torch.Tensor]]:
    """(start, logits [len, vocab]) of each chunk, teacher-forced from position 0 in slot 0."""
    if len(tokens) < 2:
        raise BadInputError(f"the corpus has {len(tokens)} token(s); at least 2 are needed")
    engine.check_fits(min(chunk, len(tokens)))
    for start in range(0, len(tokens), chunk):
        part = [int(t) for t in tokens[start : start + chunk]]
        yield start, engine.prefill(part, all_logits=True)


def record_reference(
    engine: Engine, tokens: np.ndarray, chunk: int, top_k: int, meta: dict[str, object]
) -> ReferenceLogits:
    """Every position's next-token distribution of a teacher-forced run (top-K kept per chunk)."""
    parts = [
        ReferenceLogits.from_rows(tokens, chunk, np.arange(start, start + len(rows)), rows, top_k, meta)
        for start, rows in chunk_logits(engine, tokens, chunk)
    ]
    first = parts[0]
    return ReferenceLogits(
        tokens=first.tokens,
        chunk=chunk,
        positions=np.concatenate([p.positions for p in parts]),
        logits=np.concatenate([p.logits for p in parts]),
        ids=None if first.ids is None else np.concatenate([p.ids for p in parts]),
        lse=np.concatenate([p.lse for p in parts]),
        next_logit=np.concatenate([p.next_logit for p in parts]),
        vocab_size=first.vocab_size,
        meta=meta,
    )


def candidate_rows(engine: Engine, reference: ReferenceLogits) -> torch.Tensor:
    """The candidate's logits [P, vocab] at the reference's stored positions, same chunking."""
    if engine.config.vocab_size != reference.vocab_size:
        raise BadInputError(
            f"--reference: recorded with a vocabulary of {reference.vocab_size} tokens, the model has "
            f"{engine.config.vocab_size}"
        )
    wanted = set(reference.positions.tolist())
    found: dict[int, torch.Tensor] = {}
    for start, rows in chunk_logits(engine, reference.tokens, reference.chunk):
        for offset in range(len(rows)):
            if start + offset in wanted:
                found[start + offset] = rows[offset]
    return torch.stack([found[int(p)] for p in reference.positions])

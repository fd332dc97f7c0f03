"""SentencePiece-style ("llama") tokenization: llama.cpp's score-driven merge.

Text (spaces already escaped as U+2581 "▁") starts as one symbol per character; the adjacent
pair whose concatenation is the vocabulary token with the highest score merges first (the
leftmost pair on ties), until no adjacent pair forms a token. A final symbol that is not a token
(a character outside the vocabulary) is spelled as byte tokens ``<0xXX>``.

This is done in Python rather than as an HF ``tokenizers`` BPE model because expressing the
score order as BPE merges needs every split of every token (515k merges for gemma3's 262k
vocabulary), which costs seconds at load; here loading is one dictionary. To keep long texts
fast, text is cut into words where no token can span the cut (before a "▁" that follows a
character that never precedes "▁" inside a token), and words are memoised.
"""

from __future__ import annotations

import heapq
import re

import numpy as np

from gufo.tokenizer.vocab import Vocab

SPACE = "\u2581"
_CACHE_LIMIT = 200_000


class SpmEncoder:
    def __init__(self, vocab: Vocab) -> None:
        self._t2i = vocab.token_to_id
        self._neg_scores: list[float] = (-np.asarray(vocab.scores, dtype=np.float64)).tolist()
        unk = vocab.special.get("unk")
        self._byte_ids: list[int | None] = []
        for b in range(256):
            tid = self._t2i.get(f"<0x{b:02X}>")
            if tid is None:
                tid = self._t2i.get(chr(b)) if b < 128 else None
            self._byte_ids.append(tid if tid is not None else unk)
        # characters that precede "▁" inside some token: a cut after them could be spanned
        joined = "\0".join(vocab.tokens)
        sticky = {m.group(1) for m in re.finditer(f"([^{SPACE}\0]){SPACE}", joined)}
        if joined.count("\0") != len(vocab.tokens) - 1:  # some token holds a NUL itself
            for t in (t for t in vocab.tokens if "\0" in t):
                sticky.update(t[i - 1] for i in range(1, len(t)) if t[i] == SPACE)
            sticky.discard(SPACE)
        if sticky:
            cls = "".join(re.escape(c) for c in sorted(sticky))
            self._cut = re.compile(f"(?<=[^{SPACE}{cls}])(?={SPACE})")
        else:
            self._cut = re.compile(f"(?<=[^{SPACE}])(?={SPACE})")
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._cache
        for word in self._cut.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = self._encode_word(word)
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                cache[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, s: str) -> list[int]:
        n = len(s)
        if n == 0:
            return []
        t2i = self._t2i
        neg_scores = self._neg_scores
        size = [1] * n  # characters in each symbol; 0 once merged into its left neighbour
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []
        for i in range(n - 1):
            tid = t2i.get(s[i : i + 2])
            if tid is not None:
                heap.append((neg_scores[tid], i, i + 1, 2))
        heapq.heapify(heap)
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            _, left, right, total = pop(heap)
            sl, sr = size[left], size[right]
            if sl == 0 or sr == 0 or sl + sr != total:
                continue  # outdated pair
            size[left] = total
            size[right] = 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            before = prev[left]
            if before >= 0:
                t = total + size[before]
                tid = t2i.get(s[before : before + t])
                if tid is not None:
                    push(heap, (neg_scores[tid], before, left, t))
            if after >= 0:
                t = total + size[after]
                tid = t2i.get(s[left : left + t])
                if tid is not None:
                    push(heap, (neg_scores[tid], left, after, t))
        out: list[int] = []
        i = 0
        while i >= 0:
            piece = s[i : i + size[i]]
            tid = t2i.get(piece)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(b for b in (self._byte_ids[c] for c in piece.encode("utf-8")) if b is not None)
            i = nxt[i]
        return out

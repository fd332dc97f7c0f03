"""A json_object reply that fits its token budget: as the budget runs out, the open strings, arrays and
objects get closed, so a reply cut by `max_tokens` still parses (its finish_reason stays "length").

`Cursor` follows the reply's text byte by byte through the `JSON_OBJECT` grammar (one line, `", "` and
`": "` between items) and knows the shortest text that completes it (`closing`: `"` for an open string,
`": 0` after a key, `0` where a value must come, then a `]` or `}` per open container). Every byte of
that text is a token of its own in the vocabularies gufo reads, so with r tokens left and a closing of c
bytes the reply can always be completed while r >= c. `BudgetTable` holds what a vocabulary needs for the
mask: each token's bytes, an upper bound on how many bytes it can add to the closing (the sum of each of
its bytes' largest growth, found by walking every cursor state), and the tokens made of closing bytes.
`ReplyBudget` is one request's cursor and budget: while r - 1 > c it forbids only the tokens that would
grow the closing past r - 1 (simulated exactly, and only for tokens whose bound says they might); at
r <= c it allows only a prefix of the closing.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import numpy as np

QUOTE, BACKSLASH = ord('"'), ord("\\")
LITERALS = {ord("t"): "rue", ord("f"): "alse", ord("n"): "ull"}  # the rest of true, false, null
ESCAPES = frozenset(b'"\\/bfnrt')
HEX = frozenset(b"0123456789abcdefABCDEF")
DIGITS = frozenset(b"0123456789")
# A number's states that need one more digit to be complete; the others may end where they are.
NUMBER_NEEDS_DIGIT = frozenset({"minus", "dot", "e", "sign"})
# The lead bytes whose next byte has a narrower range than 0x80-0xBF (no overlong forms, no surrogates,
# nothing above U+10FFFF: RFC 3629), and the lowest byte a closing may use after them.
UTF8_NEXT = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
UTF8_LOWEST = {lead: low for lead, (low, _) in UTF8_NEXT.items()}
MAX_KEPT_CURSORS = 1024
FEW = 4096  # where testing tokens one by one against the mask costs less than unpacking all its bits
CLOSING_BYTES = frozenset(b'{}[]":, 0\x80\x90\xa0' + b"".join(s.encode() for s in LITERALS.values()))


class Cursor(NamedTuple):
    """Where a JSON_OBJECT text is: `frames` the open containers ('o' object, 'a' array), innermost
    last; `mode` what may come next; `key` whether the open string is an object's key; `escape` in a
    string: -1 right after a backslash, 1-4 the hex digits a \\u escape still needs; `rest` what a
    literal (true, false, null) still needs; `utf8` the continuation bytes a character still needs (a
    token may end inside one), `lead` its first byte where that narrows the next byte's range."""

    frames: str = ""
    mode: str = "start"
    key: bool = False
    escape: int = 0
    rest: str = ""
    utf8: int = 0
    lead: int = 0

    def closing(self) -> bytes:
        """The shortest text after which the grammar may end."""
        if self.mode == "start":
            return b"{}"
        return self._pending_text() + b"".join(b"}" if f == "o" else b"]" for f in reversed(self.frames))

    def _pending_text(self) -> bytes:
        mode = self.mode
        if mode == "string":
            character = (
                bytes([UTF8_LOWEST.get(self.lead, 0x80)] + [0x80] * (self.utf8 - 1)) if self.utf8 else b""
            )
            escape = b'"' if self.escape == -1 else b"0" * self.escape
            return character + escape + b'"' + (b": 0" if self.key else b"")
        if mode == "value":
            return b"0"
        if mode == "comma":
            return b' "": 0' if self.frames[-1] == "o" else b" 0"
        if mode == "key":
            return b'"": 0'
        if mode == "colon_due":
            return b": 0"
        if mode == "space_due":
            return b" 0"
        if mode == "literal":
            return self.rest.encode()
        if mode.startswith("number:"):
            return b"0" if mode[7:] in NUMBER_NEEDS_DIGIT else b""
        return b""  # "open" (a container may close at once), "after" (a complete value)

    def step(self, byte: int) -> Cursor | None:
        """The cursor after `byte`, or None where the grammar has no place for it."""
        mode, frames = self.mode, self.frames
        if mode == "string":
            return self._string_step(byte)
        if mode == "start":
            return Cursor("o", "open") if byte == ord("{") else None
        if mode == "open" and byte == ord("}" if frames[-1] == "o" else "]"):
            return Cursor(frames[:-1], "after")
        if mode == "open" and frames[-1] == "o" or mode == "key":
            return Cursor(frames, "string", key=True) if byte == QUOTE else None
        if mode in ("open", "value"):
            return self._value_step(byte)
        if mode == "comma":
            return Cursor(frames, "key" if frames[-1] == "o" else "value") if byte == ord(" ") else None
        if mode == "colon_due":
            return Cursor(frames, "space_due") if byte == ord(":") else None
        if mode == "space_due":
            return Cursor(frames, "value") if byte == ord(" ") else None
        if mode == "literal":
            if byte != ord(self.rest[0]):
                return None
            return (
                Cursor(frames, "literal", rest=self.rest[1:])
                if len(self.rest) > 1
                else Cursor(frames, "after")
            )
        if mode.startswith("number:"):
            return self._number_step(mode[7:], byte)
        # "after": a complete value; a separator or its container's end follows.
        if not frames:
            return None
        if byte == ord(","):
            return Cursor(frames, "comma")
        if byte == ord("}" if frames[-1] == "o" else "]"):
            return Cursor(frames[:-1], "after")
        return None

    def _string_step(self, byte: int) -> Cursor | None:
        if self.escape == -1:  # right after a backslash
            if byte == ord("u"):
                return self._replace(escape=4)
            return self._replace(escape=0) if byte in ESCAPES else None
        if self.escape:  # inside \uXXXX
            return self._replace(escape=self.escape - 1) if byte in HEX else None
        if self.utf8:
            low, high = UTF8_NEXT.get(self.lead, (0x80, 0xBF))
            return self._replace(utf8=self.utf8 - 1, lead=0) if low <= byte <= high else None
        if byte >= 0x80:
            due = (
                1 if 0xC2 <= byte <= 0xDF else 2 if 0xE0 <= byte <= 0xEF else 3 if 0xF0 <= byte <= 0xF4 else 0
            )
            return self._replace(utf8=due, lead=byte if byte in UTF8_NEXT else 0) if due else None
        if byte == QUOTE:
            return Cursor(self.frames, "colon_due" if self.key else "after")
        if byte == BACKSLASH:
            return self._replace(escape=-1)
        return None if byte < 0x20 else self  # an ASCII character of the string

    def _value_step(self, byte: int) -> Cursor | None:
        frames = self.frames
        if byte == ord("{"):
            return Cursor(frames + "o", "open")
        if byte == ord("["):
            return Cursor(frames + "a", "open")
        if byte == QUOTE:
            return Cursor(frames, "string")
        if byte in LITERALS:
            return Cursor(frames, "literal", rest=LITERALS[byte])
        if byte == ord("-"):
            return Cursor(frames, "number:minus")
        if byte == ord("0"):
            return Cursor(frames, "number:zero")
        if byte in DIGITS:
            return Cursor(frames, "number:int")
        return None

    def _number_step(self, state: str, byte: int) -> Cursor | None:
        frames, digit = self.frames, byte in DIGITS
        if state == "minus":
            return Cursor(frames, "number:zero" if byte == ord("0") else "number:int") if digit else None
        if state in ("dot", "sign"):
            return Cursor(frames, "number:frac" if state == "dot" else "number:exp") if digit else None
        if state == "e":
            if digit:
                return Cursor(frames, "number:exp")
            return Cursor(frames, "number:sign") if byte in b"+-" else None
        # A complete number ("zero", "int", "frac", "exp") goes on, or ends before this byte.
        if digit and state != "zero":
            return self
        if byte == ord(".") and state in ("zero", "int"):
            return Cursor(frames, "number:dot")
        if byte in b"eE" and state in ("zero", "int", "frac"):
            return Cursor(frames, "number:e")
        return Cursor(frames, "after").step(byte)

    def run(self, data: bytes) -> Cursor | None:
        cursor: Cursor | None = self
        for byte in data:
            cursor = cursor.step(byte)
            if cursor is None:
                return None
        return cursor


@functools.cache
def growth_bounds() -> np.ndarray:
    """[256] the most one byte can add to the closing's length, over every cursor state up to three
    containers deep (deeper ones behave alike: only the innermost container's kind matters to a byte)."""
    bounds = np.zeros(256, dtype=np.int32)
    seen = {Cursor()}
    frontier = [Cursor()]
    while frontier:
        cursor = frontier.pop()
        base = len(cursor.closing())
        for byte in range(256):
            after = cursor.step(byte)
            if after is None:
                continue
            bounds[byte] = max(bounds[byte], len(after.closing()) - base)
            if after not in seen and len(after.frames) <= 3:
                seen.add(after)
                frontier.append(after)
    return bounds


class BudgetTable:
    """One vocabulary's tables for `ReplyBudget` (built once per tokenizer: numpy over all its bytes).

    Inside a string (not in an escape), a token without a quote or backslash changes the closing only by
    the UTF-8 character it leaves open at its end: `tail_due` gives that exactly, so those tokens, nearly
    the whole vocabulary, need no walk. Every other token is walked only when its bound (the sum of its
    bytes' `growth_bounds`) exceeds the slack."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        flat = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        total = np.concatenate(([0], np.cumsum(growth_bounds()[flat])))
        bound = total[ends] - total[starts]
        quoting = (flat == QUOTE) | (flat == BACKSLASH)
        owner = np.repeat(np.arange(len(pieces)), lengths)
        special = np.zeros(len(pieces), dtype=bool)
        special[owner[quoting]] = True
        quoted, plain = np.nonzero(special)[0], np.nonzero(~special)[0]
        self.bound = bound
        self.outside = self._by_bound(np.arange(len(pieces)), bound)
        self.quoted = quoted
        self.quoted_bound = int(bound[quoted].max(initial=0))
        self._quoted_growth: dict[Cursor, np.ndarray] = {}  # a string's cursor -> each quoted token's growth
        self.string_plain = self._by_bound(plain, self._tail_due(flat, owner, ends, len(pieces))[plain])
        self.closing_tokens: dict[bytes, list[int]] = {}
        for token, piece in enumerate(pieces):
            if piece and len(piece) <= 16 and set(piece) <= CLOSING_BYTES:
                self.closing_tokens.setdefault(piece, []).append(token)
        # The closing's ASCII bytes each need a token (a closing inside a multi-byte character also uses
        # a continuation byte; a vocabulary without it leaves that rare reply as the grammar has it).
        self.complete = all(bytes([b]) in self.closing_tokens for b in CLOSING_BYTES if b < 0x80)
        # the strings of most replies (keys and values one or two objects deep), walked here, where the
        # table is built off the scheduler's thread, rather than in a decode step
        for frames, key in itertools.product(("o", "oo", "oa"), (True, False)):
            self._growth_of_quoted(Cursor(frames, "string", key=key))

    @staticmethod
    def _tail_due(flat: np.ndarray, owner: np.ndarray, ends: np.ndarray, count: int) -> np.ndarray:
        """[tokens] the continuation bytes the character begun by each token's last lead byte still
        needs at the token's end (0 where it has none or its last character is whole)."""
        position = np.arange(len(flat))
        last_lead = np.full(count, -1, dtype=np.int64)
        leads = flat >= 0xC0
        np.maximum.at(last_lead, owner[leads], position[leads])
        has = last_lead >= 0
        lead = flat[last_lead[has]]
        size = np.where(lead >= 0xF0, 4, np.where(lead >= 0xE0, 3, 2))
        due = np.zeros(count, dtype=np.int64)
        due[has] = np.maximum(size - (ends[has] - last_lead[has]), 0)
        return due

    @staticmethod
    def _by_bound(ids: np.ndarray, bound: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(`ids` ordered by `bound` (one per id), those bounds ascending)."""
        order = np.argsort(bound, kind="stable")
        return ids[order], bound[order]

    @staticmethod
    def _above(table: tuple[np.ndarray, np.ndarray], value: int) -> np.ndarray:
        ids, bounds = table
        return ids[np.searchsorted(bounds, value, side="right") :]

    def growing(self, cursor: Cursor, slack: int, bitmask: np.ndarray) -> np.ndarray:
        """The tokens `bitmask` allows after which `cursor`'s closing is more than `slack` bytes longer."""
        if cursor.mode == "string" and cursor.escape == 0:  # nearly every token is allowed
            plain = self._above(self.string_plain, slack + cursor.utf8)
            if slack < self.quoted_bound:
                plain = np.concatenate((plain, self.quoted[self._growth_of_quoted(cursor) > slack]))
            return allowed(plain, bitmask)
        suspects = self._above(self.outside, slack)
        if len(suspects) > FEW:  # few tokens are allowed outside strings: take those first
            suspects = np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little"))
            suspects = suspects[self.bound[suspects] > slack]
        else:
            suspects = allowed(suspects, bitmask)
        base = len(cursor.closing())
        return np.array(
            [t for t in suspects.tolist() if self.growth(cursor, base, t) > slack], dtype=np.int64
        )

    def _growth_of_quoted(self, cursor: Cursor) -> np.ndarray:
        """[quoted tokens] each one's growth of the closing from `cursor`, a string's, walked once per
        cursor (a reply's strings share few: the containers around them, key or value, a character's
        bytes due) and kept."""
        growth = self._quoted_growth.get(cursor)
        if growth is None:
            if len(self._quoted_growth) >= MAX_KEPT_CURSORS:
                self._quoted_growth.clear()
            base = len(cursor.closing())
            growth = np.array([self.growth(cursor, base, t) for t in self.quoted.tolist()], dtype=np.int64)
            self._quoted_growth[cursor] = growth
        return growth

    def growth(self, cursor: Cursor, base: int, token: int) -> int:
        """How many bytes `token` (walked) adds to `cursor`'s closing of `base` bytes; -base - 1 where
        the grammar has no place for it (it grows nothing the mask would have to forbid)."""
        after = cursor.run(self.pieces[token])
        return -base - 1 if after is None else len(after.closing()) - base


def allowed(ids: np.ndarray, bitmask: np.ndarray) -> np.ndarray:
    """Those of `ids` whose bit is set in `bitmask` (int32 words; bit i of word w is token 32w + i)."""
    return ids[(bitmask[ids >> 5] >> (ids & 31)) & 1 == 1]


class ReplyBudget:
    """One reply's cursor and token budget; the history of cursors lets speculation roll tokens back."""

    def __init__(self, table: BudgetTable, tokens: int):
        self._table = table
        self._budget = tokens
        self._cursors: list[Cursor | None] = [Cursor()]  # None: the text left the grammar's shape

    @property
    def _left(self) -> int:
        return self._budget - (len(self._cursors) - 1)

    def _closing_ids(self, closing: bytes) -> list[int]:
        tokens = self._table.closing_tokens
        return [t for k in range(1, len(closing) + 1) for t in tokens.get(closing[:k], ())]

    def _state(self) -> tuple[Cursor, int, bytes] | None:
        """(the cursor, the tokens left, its closing), or None where the budget cannot help (the text
        left the grammar's shape, or the vocabulary lacks a closing byte's token)."""
        cursor = self._cursors[-1]
        if cursor is None or not self._table.complete:
            return None
        return cursor, self._left, cursor.closing()

    def restrict(self, bitmask: np.ndarray) -> None:
        """Clear, in one row of an xgrammar bitmask, the allowed tokens after which the closing would no
        longer fit the tokens left."""
        state = self._state()
        if state is None:
            return
        cursor, left, closing = state
        if left <= len(closing):  # only the closing fits: a prefix of it
            kept = allowed(np.array(self._closing_ids(closing), dtype=np.int64), bitmask)
            if kept.size:  # else the closing cannot be written here (never in the grammar): as it was
                bitmask[:] = 0
                np.bitwise_or.at(bitmask, kept >> 5, np.left_shift(1, kept & 31).astype(np.int32))
            return
        over = self._table.growing(cursor, left - 1 - len(closing), bitmask)
        np.bitwise_and.at(bitmask, over >> 5, ~np.left_shift(1, over & 31).astype(np.int32))

    def take(self, token: int) -> bool:
        """Move past `token` if `restrict` leaves it allowed (the grammar aside): False, the state
        unchanged, if not. The token is walked once, for the check and the next cursor alike."""
        cursor = self._cursors[-1]
        after = None if cursor is None else cursor.run(self._table.pieces[token])
        state = self._state()
        if state is not None:
            _, left, closing = state
            if left <= len(closing):
                if token not in self._closing_ids(closing):
                    return False
            elif after is not None and len(after.closing()) > left - 1:
                return False
        self._cursors.append(after)
        return True

    def rollback(self, count: int) -> None:
        del self._cursors[len(self._cursors) - count :]

"""Token ids -> text, as llama.cpp's ``token_to_piece`` and ``detokenize`` do it.

A piece is the token's bytes: SentencePiece tokens with "▁" turned into spaces, byte-level BPE
tokens mapped back through the GPT-2 byte alphabet, ``<0xXX>`` byte tokens as one byte, and
control/user-defined tokens as their text (control ones only when special tokens are shown).
Some BPE vocabularies also "clean spaces" (drop the space before ``? ! . ,`` and in front of a
few English contractions); that is done on the joined bytes, and incrementally for streaming.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable

from gufo.tokenizer.vocab import Vocab

# (token id, whether special tokens show, whether to drop one leading space) -> the token's bytes
PieceOf = Callable[[int, bool, bool], bytes]


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's reversible byte <-> printable character map (character -> byte)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}


BYTE_OF_CHAR = _byte_alphabet()


def byte_level_decode(text: str) -> bytes:
    """Bytes of a byte-level BPE token text (llama.cpp's ``llama_decode_text``)."""
    out = bytearray()
    for ch in text:
        b = BYTE_OF_CHAR.get(ch)
        if b is not None:
            out.append(b)
        else:
            raw = ch.encode("utf-8")
            out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


# llama.cpp's clean-up passes, in order: " ?" " !" " ." " ," lose the space; " ' " becomes "'";
# " 's" " 'm" " 're" " 've" lose the space.
_CLEAN_PASSES = (
    ((b" ?", b"?"), (b" !", b"!"), (b" .", b"."), (b" ,", b",")),
    ((b" ' ", b"'"),),
    ((b" 's", b"'s"), (b" 'm", b"'m"), (b" 're", b"'re"), (b" 've", b"'ve")),
)
_CLEAN_REGEXES = tuple(
    (re.compile(b"|".join(re.escape(src) for src, _ in rules)), dict(rules)) for rules in _CLEAN_PASSES
)


def clean_spaces(data: bytes) -> bytes:
    for rx, repl in _CLEAN_REGEXES:
        data = rx.sub(lambda m, repl=repl: repl[m.group()], data)
    return data


class _Replacer:
    """Streaming left-to-right replacement of a few patterns (none a prefix of another)."""

    def __init__(self, rules: tuple[tuple[bytes, bytes], ...]) -> None:
        self._rules = dict(rules)
        self._prefixes = {src[:k] for src in self._rules for k in range(1, len(src))}
        self._buf = b""

    def push(self, data: bytes) -> bytes:
        out = bytearray()
        buf = self._buf
        for i in range(len(data)):
            buf += data[i : i + 1]
            while buf:
                if buf in self._rules:
                    out += self._rules[buf]
                    buf = b""
                elif buf in self._prefixes:
                    break
                else:
                    out += buf[:1]
                    buf = buf[1:]
        self._buf = buf
        return bytes(out)

    def flush(self) -> bytes:
        buf, self._buf = self._buf, b""
        return buf


class _StreamCleaner:
    def __init__(self) -> None:
        self._stages = [_Replacer(rules) for rules in _CLEAN_PASSES]

    def push(self, data: bytes) -> bytes:
        for stage in self._stages:
            data = stage.push(data)
        return data

    def flush(self) -> bytes:
        data = b""
        for stage in self._stages:
            data = stage.push(data) + stage.flush()
        return data


class StreamDecoder:
    """Turns token ids, one at a time, into text that never splits a UTF-8 character.

    ``"".join(d.push(i) for i in ids) + d.flush() == tok.decode(ids)``.
    """

    def __init__(self, vocab: Vocab, piece_of: PieceOf, skip_special: bool = False) -> None:
        self._vocab, self._piece_of = vocab, piece_of
        self._skip_special = skip_special
        self._first = True
        self._cleaner = _StreamCleaner() if vocab.clean_spaces else None
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        if self._first:
            self._first = False
            vocab = self._vocab
            if self._skip_special and vocab.add_bos and token_id == vocab.special["bos"]:
                piece = b""  # a leading BOS is dropped and then no space is stripped
            else:
                piece = self._piece_of(token_id, not self._skip_special, vocab.add_space_prefix)
        else:
            piece = self._piece_of(token_id, not self._skip_special, False)
        if self._cleaner is not None:
            piece = self._cleaner.push(piece)
        return self._utf8.decode(piece)

    def flush(self) -> str:
        rest = self._cleaner.flush() if self._cleaner is not None else b""
        self._first = True
        if self._cleaner is not None:
            self._cleaner = _StreamCleaner()
        return self._utf8.decode(rest, final=True)

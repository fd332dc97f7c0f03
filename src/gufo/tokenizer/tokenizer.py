"""The tokenizer of a GGUF model, agreeing with llama.cpp token for token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gufo.errors import BadInputError
from gufo.tokenizer import chat
from gufo.tokenizer.bpe import build_bpe
from gufo.tokenizer.detok import StreamDecoder, byte_level_decode, clean_spaces
from gufo.tokenizer.spm import SpmEncoder
from gufo.tokenizer.vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_LSTRIP,
    ATTR_NORMAL,
    ATTR_RSTRIP,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocab,
    load_vocab,
)

_C_SPACE = " \t\n\v\f\r"  # C isspace(), what llama.cpp strips around lstrip/rstrip tokens
_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN  # pieces shown only when special tokens are rendered
_PREFIX_CHARS = 4


def _group_by_prefix(specials: list[tuple[str, int, int]]) -> dict[str, list[tuple[int, str, int, int]]]:
    """Special tokens grouped by their first characters, so that one substring test rules out a
    whole group (gemma3 has 6k ``<unusedN>`` tokens); entries keep their longest-first rank."""
    groups: dict[str, list[tuple[int, str, int, int]]] = {}
    for rank, (text, tid, attr) in enumerate(specials):
        groups.setdefault(text[:_PREFIX_CHARS], []).append((rank, text, tid, attr))
    return groups


class Tokenizer:
    """Encode text to token ids and back, from GGUF tokenizer metadata.

    ``tokenizer.ggml.model`` ``gpt2``: byte-level BPE on HF ``tokenizers`` with the pre-tokenizer
    named by ``tokenizer.ggml.pre``; ``llama``: SentencePiece-style score-driven merges with byte
    fallback. Control and user-defined tokens are matched as whole tokens first, like llama.cpp.
    """

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._pieces: list[bytes | None] = [None] * vocab.size
        self._spm: SpmEncoder | None = SpmEncoder(vocab) if vocab.model == "llama" else None
        self._hf: Any = build_bpe(vocab) if vocab.model == "gpt2" else None
        tokens, attrs = vocab.tokens, vocab.attrs
        specials = [(tokens[t], t, attrs[t]) for t in vocab.special_cache]
        self._specials_all = _group_by_prefix(specials)
        self._specials_user = _group_by_prefix([s for s in specials if not s[2] & _HIDDEN])

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build from GGUF metadata (key -> value as ``gguf.ReaderField.contents()`` gives it)."""
        return cls(load_vocab(metadata))

    # ---- facts -------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._vocab.size

    @property
    def bos_id(self) -> int | None:
        return self._vocab.special["bos"]

    @property
    def eos_id(self) -> int | None:
        return self._vocab.special["eos"]

    @property
    def add_bos(self) -> bool:
        return self._vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self._vocab.add_eos

    @property
    def eog_ids(self) -> frozenset[int]:
        return self._vocab.eog_ids

    @property
    def chat_template(self) -> str | None:
        return self._vocab.chat_template

    @property
    def model(self) -> str:
        """``gpt2`` or ``llama`` (the GGUF ``tokenizer.ggml.model``)."""
        return self._vocab.model

    def is_special(self, token_id: int) -> bool:
        """Control or unknown tokens: hidden from text unless special tokens are shown."""
        return bool(self._vocab.attrs[self._check_id(token_id)] & _HIDDEN)

    # ---- encoding ----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``. ``add_special`` adds BOS (and EOS) where the model asks for it;
        ``parse_special`` matches control tokens written in the text (user-defined ones always)."""
        vocab = self._vocab
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and vocab.add_bos:
            out.append(self._required("bos"))
        if self._spm is not None:
            prev_special = True  # a space is put in front of text at the start and after a token
            for frag in fragments:
                if isinstance(frag, str):
                    if vocab.add_space_prefix and prev_special:
                        frag = " " + frag
                    out += self._spm.encode(frag.replace(" ", "\u2581"))
                    prev_special = False
                else:
                    out.append(frag)
                    prev_special = True
        else:
            hf = self._hf
            for frag in fragments:
                if isinstance(frag, str):
                    out += hf.encode(frag, add_special_tokens=False).ids
                else:
                    out.append(frag)
        if add_special and vocab.add_eos:
            out.append(self._required("eos"))
        return out

    def _required(self, role: str) -> int:
        tid = self._vocab.special[role]
        if tid is None:
            raise BadInputError(f"tokenizer: the model asks for a {role.upper()} token but has none")
        return tid

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split ``text`` into plain fragments and special token ids, longest token texts first."""
        groups = self._specials_all if parse_special else self._specials_user
        present = [
            entry
            for prefix, entries in groups.items()
            if prefix in text
            for entry in entries
            if entry[1] in text
        ]
        present.sort()
        fragments: list[str | int] = [text]
        for _, tok_text, tid, attr in present:
            out: list[str | int] = []
            for frag in fragments:
                if not isinstance(frag, str) or tok_text not in frag:
                    out.append(frag)
                    continue
                pos = 0
                while True:
                    match = frag.find(tok_text, pos)
                    if match < 0:
                        break
                    left = frag[pos:match]
                    if attr & ATTR_LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        out.append(left)
                    out.append(tid)
                    pos = match + len(tok_text)
                    if attr & ATTR_RSTRIP:
                        while pos < len(frag) and frag[pos] in _C_SPACE:
                            pos += 1
                if pos < len(frag):
                    out.append(frag[pos:])
            fragments = out
        return fragments

    # ---- decoding ----------------------------------------------------------------------------

    def _check_id(self, token_id: int) -> int:
        token_id = int(token_id)
        if not 0 <= token_id < self._vocab.size:
            raise BadInputError(f"token id {token_id} is out of range (vocabulary has {self._vocab.size})")
        return token_id

    def _piece(self, token_id: int, special: bool, lstrip: bool = False) -> bytes:
        """Bytes of one token (llama.cpp ``token_to_piece``); ``lstrip`` drops one leading space."""
        token_id = self._check_id(token_id)
        attr = self._vocab.attrs[token_id]
        if attr & _HIDDEN and not special:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._make_piece(token_id, attr)
        if lstrip and piece[:1] == b" ":
            piece = piece[1:]
        return piece

    def _make_piece(self, token_id: int, attr: int) -> bytes:
        text = self._vocab.tokens[token_id]
        if attr & (_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self._spm is not None:
                return text.replace("\u2581", " ").encode("utf-8")
            return byte_level_decode(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode_bytes(self, ids: Sequence[int], skip_special: bool = False) -> bytes:
        """The raw bytes of ``ids`` (llama.cpp ``llama_detokenize``; ``skip_special`` is its
        ``remove_special`` plus not rendering control tokens)."""
        vocab = self._vocab
        ids = list(ids)
        remove_space = vocab.add_space_prefix
        if skip_special and vocab.add_bos and ids and ids[0] == vocab.special["bos"]:
            remove_space = False
            ids = ids[1:]
        if skip_special and vocab.add_eos and ids and ids[-1] == vocab.special["eos"]:
            ids = ids[:-1]
        special = not skip_special
        parts = [self._piece(t, special) for t in ids]
        if remove_space and ids:
            parts[0] = self._piece(ids[0], special, lstrip=True)
        data = b"".join(parts)
        return clean_spaces(data) if vocab.clean_spaces else data

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text of ``ids``; invalid UTF-8 (a character cut at the end) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def piece(self, token_id: int) -> bytes:
        """One token's bytes, special tokens rendered (llama.cpp ``common_token_to_piece``)."""
        return self._piece(token_id, special=True)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token adds in the middle of a text; empty for control tokens."""
        return self._piece(token_id, special=False)

    def token_text(self, token_id: int) -> str:
        """One token as text for display: its piece, with bytes that are not UTF-8 as ``<0xXX>``."""
        piece = self.piece(token_id)
        try:
            return piece.decode("utf-8")
        except UnicodeDecodeError:
            out = []
            rest = piece
            while rest:
                try:
                    out.append(rest.decode("utf-8"))
                    break
                except UnicodeDecodeError as e:
                    out.append(rest[: e.start].decode("utf-8"))
                    out.extend(f"<0x{b:02X}>" for b in rest[e.start : e.end])
                    rest = rest[e.end :]
            return "".join(out)

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """Incremental ``decode``: ``push(id)`` returns only complete UTF-8 characters."""
        return StreamDecoder(self._vocab, self._piece, skip_special=skip_special)

    # ---- chat --------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        template: str | None = None,
        **variables: Any,
    ) -> str:
        """Render ``messages`` with ``template`` (jinja source), else the model's chat template (a
        built-in one when the GGUF has none). Like llama.cpp, a leading BOS text is removed when
        encoding adds BOS itself, so the result is meant for
        ``encode(prompt, add_special=True, parse_special=True)``."""
        vocab = self._vocab
        source = template or vocab.chat_template or chat.fallback_template(vocab.architecture)
        bos = vocab.special["bos"]
        eos = vocab.special["eos"]
        bos_text = self.token_text(bos) if bos is not None else ""
        eos_text = self.token_text(eos) if eos is not None else ""
        variables.setdefault("bos_token", bos_text)
        variables.setdefault("eos_token", eos_text)
        text = chat.render(source, messages, add_generation_prompt, **variables)
        if vocab.add_bos and bos_text and text.startswith(bos_text):
            text = text[len(bos_text) :]
        if vocab.add_eos and eos_text and text.endswith(eos_text):
            text = text[: -len(eos_text)]
        return text

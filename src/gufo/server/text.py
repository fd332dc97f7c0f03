"""Generated token ids -> the text a client sees: stop strings cut it, and while streaming, text that
could be the start of a stop string is held back until it is known not to be one."""

from __future__ import annotations

from collections.abc import Iterable

from gufo.tokenizer import Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop_strings: Iterable[str] = (), stop_ids: Iterable[int] = ()):
        self._decoder = tokenizer.stream_decoder()
        self._hidden = tokenizer.eog_ids | frozenset(stop_ids)  # they end generation and show nothing
        self._stops = [s for s in stop_strings if s]
        self._held = ""
        self.stopped = False  # a stop string was found: the text is complete

    def push(self, token: int) -> str:
        """The text that can be released after `token`."""
        if self.stopped or token in self._hidden:
            return ""
        self._held += self._decoder.push(token)
        return self._release(final=False)

    def finish(self) -> str:
        """The rest, once generation has ended."""
        if self.stopped:
            return ""
        self._held += self._decoder.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        found = [i for i in (self._held.find(s) for s in self._stops) if i >= 0]
        if found:
            out, self._held, self.stopped = self._held[: min(found)], "", True
            return out
        # A match can only begin in the held-back suffix: everything before it was checked already.
        keep = 0 if final else self._partial_stop_length()
        out, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return out

    def _partial_stop_length(self) -> int:
        held = self._held
        for k in range(min(len(held), max((len(s) for s in self._stops), default=1) - 1), 0, -1):
            if any(s.startswith(held[-k:]) for s in self._stops):
                return k
        return 0

"""Streaming a generation's text to a terminal as tokens arrive."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any


class TextStream:
    """Writes a generation's text as it grows, one token at a time.

    The text is decoded from prompt + new ids, and what follows the decoded prompt is shown (so a
    tokenizer that drops a word's leading space at the start of a text still shows it). Output is
    held back while the text ends with U+FFFD: the last tokens may be an incomplete UTF-8 character
    that the next byte-level token completes. `prefix` (the prompt as typed) is written first, once
    there is output (on the first token or at close, so a failed run prints nothing).

    `out`: a file (written and flushed; default stdout) or a function called with each new piece.
    `decode`: ids -> text; default the tokenizer's own `decode`."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = (), prefix: str = "", out: Any = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.decode = decode if decode is not None else tokenizer.decode
        self.prompt_ids = list(prompt_ids)
        self.prompt_text = self.decode(self.prompt_ids)
        self.new_ids: list[int] = []
        self.out = out if out is not None else sys.stdout
        self.prefix = prefix  # written with the first output
        self.shown = 0  # characters of the new text written so far

    def text(self) -> str:
        full = self.decode(self.prompt_ids + self.new_ids)
        if full.startswith(self.prompt_text):
            return full[len(self.prompt_text):]
        return self.decode(self.new_ids)

    def push(self, token_id: int) -> None:
        self.new_ids.append(token_id)
        text = self.text()
        if not text.endswith("\ufffd"):
            self._write(text)

    def close(self) -> None:
        self._write(self.text())

    def _write(self, text: str) -> None:
        if self.prefix:
            self._emit(self.prefix)
            self.prefix = ""
        if len(text) > self.shown:
            self._emit(text[self.shown:])
            self.shown = len(text)
            if not callable(self.out):
                self.out.flush()

    def _emit(self, piece: str) -> None:
        if callable(self.out):
            self.out(piece)
        else:
            self.out.write(piece)

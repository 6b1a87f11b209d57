"""A choice's text as its tokens arrive: incremental detokenization and stop strings.

Text is shown only once it is final: held back while it ends with U+FFFD (the last tokens may be
an incomplete UTF-8 character that the next byte-level token completes) and while its end could
be the start of a stop string. A stop string ends the text before it (it is not returned).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from handformer.data.tokenizer import Tokenizer

# Prompt tokens decoded ahead of the new ones, so the first new token is decoded in context (a
# tokenizer may drop a word's leading space at the start of a text), as `TextStream` shows it.
CONTEXT_TOKENS = 8


def completion_decoder(tokenizer: Tokenizer, prompt: Sequence[int]) -> Callable[[list[int]], str]:
    """The text of new ids as `handformer generate` prints it after the prompt (TextStream.text)."""
    context = list(prompt[-CONTEXT_TOKENS:])
    context_text = tokenizer.decode(context)

    def decode(ids: list[int]) -> str:
        full = tokenizer.decode(context + ids)
        return full[len(context_text):] if full.startswith(context_text) else tokenizer.decode(ids)

    return decode


def chat_decoder(tokenizer: Tokenizer) -> Callable[[list[int]], str]:
    """The text of a reply as `handformer chat` returns it (special tokens skipped)."""
    return lambda ids: tokenizer.hf.decode(ids, skip_special_tokens=True)


class IncrementalText:
    """`push(token)` -> (the newly final text, whether a stop string ended the text)."""

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()) -> None:
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # the text so far (cut before a stop string once one is found)
        self.sent = 0  # characters of `text` already handed out
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, token_id: int) -> tuple[str, bool]:
        self.ids.append(token_id)
        text = self.decode(self.ids)
        found = [(i, s) for s in self.stop if (i := text.find(s, self.sent)) >= 0]
        if found:
            cut, self.matched = min(found)
            self.text, self.stopped = text[:cut], True
            return self._take(cut), True
        self.text = text
        safe = len(text.rstrip("\ufffd"))
        safe -= max((k for s in self.stop for k in range(1, len(s)) if text[:safe].endswith(s[:k])),
                    default=0)
        return self._take(safe), False

    def flush(self) -> str:
        """The text not handed out yet (at the end, nothing is held back)."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent:end], end
        return piece


__all__ = ["IncrementalText", "chat_decoder", "completion_decoder"]

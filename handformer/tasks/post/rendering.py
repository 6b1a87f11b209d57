"""Conversations into token ids, and which tokens the loss learns: the assistant's.

A conversation is rendered with the run's chat template (the sandboxed Jinja of `handformer chat`)
and tokenized once, the template's special-token text becoming special tokens as in chat. Which
characters are the assistant's is found one of two ways:

- the template marks them with `{% generation %}...{% endgeneration %}` blocks (as transformers and
  TRL read them): the text of each block, exactly as the template's author marked it;
- otherwise by rendering prefixes: assistant message i's turn runs from the end of the rendering of
  messages[:i] with the assistant header (add_generation_prompt) to where the rendering of
  messages[:i + 1] parts from the full one. The full rendering must start with each rendered prefix,
  or the template cannot be read this way and is refused (one that moves the system message into
  the last user turn, say, or whose assistant header differs from what follows it in a
  conversation). The turn is cut after its first end-of-turn token, where a chat stops the reply,
  so the loss learns the reply and the token that ends it, not the newline some templates write
  after it; a turn without one is refused (the model would never stop).

A token is the assistant's when its first character is. `train_on_prompt` learns every token.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat import common_prefix
from handformer.generation.chat_template import ChatTemplate
from handformer.tasks.post.records import Conversation


@dataclass
class Rendered:
    ids: list[int]  # the conversation's tokens
    learned: list[bool]  # per token: the loss predicts it


class ConversationRenderer:
    """Renders conversations, prompts and replies with one template and tokenizer."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, stop_ids: Sequence[int],
                 train_on_prompt: bool = False) -> None:
        self.template, self.tokenizer = template, tokenizer
        self.stop_ids = frozenset(stop_ids)
        self.train_on_prompt = train_on_prompt
        self.warnings: list[str] = []  # said once each, by the caller

    # --- SFT ------------------------------------------------------------------------------------
    def conversation(self, conv: Conversation) -> Rendered:
        """The conversation's tokens and the assistant's among them (those after conv.train_from)."""
        if self.template.has_generation_blocks:
            text, spans = self.template.render_with_spans(conv.messages, False, tools=conv.tools)
            if conv.train_from:  # a prompt_completion line: the completion's blocks only
                prompt = self.template.render(conv.messages[:conv.train_from], True, tools=conv.tools)
                spans = [(a, b) for a, b in spans if a >= len(prompt)]
            trim = False
        else:
            text, spans = self.prefix_spans(conv)
            trim = True
        ids, offsets = self.tokenizer.encode_with_offsets(text)
        if self.train_on_prompt:
            return Rendered(ids, [True] * len(ids))
        learned = [False] * len(ids)
        starts = [start for start, _ in offsets]
        for a, b in spans:
            first, last = bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)  # tokens [first, last)
            if trim:
                last = self.end_of_turn(ids, first, last, text[a:b], conv)
            elif not self.stop_ids & set(ids[first:last]) and not self.warnings:
                self.warnings.append(f"{self.template.origin} marks assistant text without an end-of-turn "
                                     f"token ({conv.where}): the model may not learn to stop")
            learned[first:last] = [True] * (last - first)
        if not any(learned):
            raise ValueError(f"{conv.where}: the conversation has no assistant reply to learn")
        return Rendered(ids, learned)

    def prefix_spans(self, conv: Conversation) -> tuple[str, list[tuple[int, int]]]:
        """The full rendering, and the (start, end) characters of each assistant turn to learn,
        from renderings of the conversation's prefixes: a turn starts where the rendering of the
        messages before it with the assistant header ends (checked to be a prefix of the full
        rendering), and lies within the part of the rendering through it that the full one shares."""
        messages, tools = conv.messages, conv.tools
        full = self.template.render(messages, False, tools=tools)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or i < conv.train_from:
                continue
            if i == 0:
                raise ValueError(f"{conv.where}: the conversation opens with an assistant message; its turn "
                                 "is found by rendering what comes before it, so start with a user message")
            before = self.template.render(messages[:i], True, tools=tools)
            if not full.startswith(before):
                raise ValueError(
                    f"{self.template.origin} cannot show which tokens are the assistant's: rendering the "
                    f"conversation up to message {i} with the assistant header ({conv.where}) is not the "
                    f"start of rendering all of it ({_first_difference(before, full)}), so a chat would "
                    "feed the model other text than it learned; mark the assistant's text with "
                    "{% generation %}...{% endgeneration %} in the template, or fix the template")
            upto = self.template.render(messages[:i + 1], False, tools=tools)
            spans.append((len(before), common_prefix(upto, full)))
        return full, spans

    def end_of_turn(self, ids: list[int], first: int, last: int, text: str, conv: Conversation) -> int:
        """One past the first end-of-turn token among tokens [first, last) of an assistant turn:
        where a chat stops the reply, so the loss learns nothing after it."""
        for j in range(first, last):
            if ids[j] in self.stop_ids:
                return j + 1
        names = sorted({self.tokenizer.hf.id_to_token(i) or str(i) for i in self.stop_ids})
        raise ValueError(f"{self.template.origin} ends the assistant's turn {text[-40:]!r} ({conv.where}) "
                         f"with none of the run's end-of-turn tokens ({', '.join(names)}): a model trained "
                         "on it would never stop; end the turn with one of them (a special token of the "
                         "tokenizer)")

    # --- prompts and replies (DPO, GRPO) ------------------------------------------------------
    def prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A prompt's tokens, ending with the assistant header (as chat feeds it)."""
        return self.tokenizer.encode_with_special_tokens(self.template.render(messages, True, tools=tools))

    def replies(self, prompt: list[dict[str, Any]], replies: Sequence[list[dict[str, Any]]],
                tools: list[dict[str, Any]] | None = None) -> tuple[list[int], list[list[int]]]:
        """(prompt ids, each reply's ids): prompt + reply rendered whole and tokenized, the reply
        being what follows the prompt's tokens (where the tokenizations of the prompt alone and of
        every prompt + reply part, if they do: the way TRL splits them)."""
        prompt_ids = self.prompt(prompt, tools)
        encode = self.tokenizer.encode_with_special_tokens
        full = [encode(self.template.render(prompt + reply, False, tools=tools)) for reply in replies]
        n = min(common_prefix(prompt_ids, ids) for ids in full)
        return prompt_ids[:n], [ids[n:] for ids in full]


def _first_difference(a: str, b: str) -> str:
    n = common_prefix(a, b)
    return f"after {a[max(0, n - 30):n]!r} one has {a[n:n + 12]!r}, the other {b[n:n + 12]!r}"


__all__ = ["ConversationRenderer", "Rendered"]

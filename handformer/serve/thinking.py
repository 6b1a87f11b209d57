"""Thinking: the reasoning section of a chat template such as Qwen3's `<think> ... </think>`.

A run thinks when its chat template writes a `<think>` section and its vocabulary holds `<think>` and
`</think>` as single tokens. Its reply is split in two: the text between the tags is the reasoning
(chat's `reasoning_content`, the Responses API's reasoning item, Anthropic's `thinking` block), the
text after `</think>` the answer. The section is open when the prompt ends with `<think>` (templates
that always think) or when the reply starts with it (Qwen3's).

A budget ends the section: after `budget` reasoning tokens the template's own closing is forced,
one token a step, and the answer follows. The closing is a newline and what the template's prompt
with thinking off writes from `</think>` on (Qwen3's `\\n</think>\\n\\n`; a template that writes
`</think>\\n` ends it so): a closing the model never saw in training throws its answer off. While
the section is open, and for the answer's first token after a forced closing, the reply's end
tokens are masked, so a reply is never all thinking and no answer; the budget is capped so that a
quarter of the reply's tokens (at least one) is left for the answer.

    reasoning effort    budget (tokens)
    "none"              no thinking (the template's enable_thinking=False)
    "minimal"           64
    "low"               256
    "medium"            1024
    "high"              4096
    "xhigh"             16384
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat_template import ChatTemplate

START, END = "<think>", "</think>"
CLOSING = "\n</think>\n\n"  # Qwen3's, forced when the budget is spent and the template shows none
EFFORT_BUDGETS = {"minimal": 64, "low": 256, "medium": 1024, "high": 4096, "xhigh": 16384}
EFFORTS = ("none", *EFFORT_BUDGETS)


@dataclass(frozen=True)
class ThinkingFormat:
    """A run's thinking tokens: `<think>`, `</think>` and the ids of CLOSING."""

    start_id: int
    end_id: int
    closing: tuple[int, ...]


def thinking_format(template: ChatTemplate | None, tokenizer: Tokenizer) -> ThinkingFormat | None:
    """The run's thinking tokens, or None when its template has no thinking section."""
    if template is None or START not in template.source or END not in template.source:
        return None
    start_id, end_id = tokenizer.hf.token_to_id(START), tokenizer.hf.token_to_id(END)
    if start_id is None or end_id is None:
        return None
    closing = tokenizer.encode_with_special_tokens(template_closing(template))
    return ThinkingFormat(start_id, end_id, tuple(closing))


def template_closing(template: ChatTemplate) -> str:
    """The text that ends a thinking section in `template`: a newline and what its generation prompt
    with enable_thinking false writes from `</think>` on; CLOSING where that prompt writes no `</think>`."""
    try:
        prompt = template.render([{"role": "user", "content": "?"}], enable_thinking=False)
    except ValueError:  # a template that needs more than one user message to render
        return CLOSING
    at = prompt.rfind(END)
    return CLOSING if at < 0 else "\n" + prompt[at:]


@dataclass(frozen=True)
class Thinking:
    """What a request asks: thinking on or off, and its budget (None: only the answer's room)."""

    enabled: bool = True
    budget: int | None = None


def effort_thinking(effort: str | None) -> Thinking:
    """OpenAI's reasoning effort as a Thinking (None: the template's default, no budget)."""
    if effort is None:
        return Thinking()
    if effort == "none":
        return Thinking(enabled=False)
    return Thinking(budget=EFFORT_BUDGETS[effort])


def capped_budget(budget: int | None, max_tokens: int, closing: int) -> int:
    """The budget left after the closing tokens and the answer's room (a quarter of max_tokens)."""
    room = max_tokens - closing - max(1, max_tokens // 4)
    return max(0, room if budget is None else min(budget, room))


def opens_thinking(prompt: str) -> bool:
    """Whether the prompt leaves the thinking section open (the template wrote `<think>`)."""
    return prompt.rstrip().endswith(START)


class ThinkingBudget:
    """A row's logit processor: while its thinking section is open, its end tokens are masked;
    after `budget` reasoning tokens the closing tokens are forced, then the answer is free."""

    def __init__(self, fmt: ThinkingFormat, budget: int, opened: bool, stop_ids: frozenset[int]) -> None:
        self.fmt, self.budget, self.opened = fmt, budget, opened
        self.stop_ids = torch.tensor(sorted(stop_ids), dtype=torch.long)

    def start(self, tokens: Sequence[int]) -> int | None:
        """Where the reasoning starts in the reply's tokens; None when the reply does not think."""
        if self.opened:
            return 0
        head = list(tokens[:4])  # a reply that thinks opens with <think>, maybe after a newline
        return head.index(self.fmt.start_id) + 1 if self.fmt.start_id in head else None

    def __call__(self, tokens: Sequence[int], logits: Tensor) -> Tensor:
        start = self.start(tokens)
        if start is None:
            return logits
        thought = tokens[start:]
        if self.fmt.end_id in thought[:self.budget]:  # the section ended on its own
            return logits
        if len(thought) < self.budget:
            return logits.index_fill(0, self.stop_ids.to(logits.device), float("-inf"))
        forced = len(thought) - self.budget
        if forced == len(self.fmt.closing):  # the answer's first token: the reply does not end here
            return logits.index_fill(0, self.stop_ids.to(logits.device), float("-inf"))
        if forced > len(self.fmt.closing):
            return logits
        out = torch.full_like(logits, float("-inf"))
        token = self.fmt.closing[forced]
        out[token] = logits[token]
        return out


def reasoning_tokens(tokens: Sequence[int], fmt: ThinkingFormat | None, opened: bool) -> int:
    """How many of a reply's tokens are its reasoning (up to and with `</think>`)."""
    if fmt is None:
        return 0
    if not opened and fmt.start_id not in tokens[:4]:
        return 0
    return tokens.index(fmt.end_id) + 1 if fmt.end_id in tokens else len(tokens)


class ThinkingSplitter:
    """A reply's text as it arrives -> (reasoning, answer). `feed` and `finish` return the text
    that is final; the end of the reasoning that may be the start of `</think>` is held back."""

    def __init__(self, opened: bool) -> None:
        self.state = "thinking-start" if opened else "start"
        self.buffer = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buffer += text
        reasoning = answer = ""
        while self.buffer:
            if self.state == "start":  # does the reply open a thinking section?
                head = self.buffer.lstrip()
                if head.startswith(START):
                    self.buffer, self.state = head[len(START):], "thinking-start"
                elif not head or START.startswith(head):
                    break
                else:
                    self.state = "answer"
            elif self.state in ("thinking-start", "gap"):  # whitespace after a tag is no text
                self.buffer = self.buffer.lstrip()
                if self.buffer:
                    self.state = "thinking" if self.state == "thinking-start" else "answer"
            elif self.state == "thinking":
                end = self.buffer.find(END)
                if end >= 0:
                    reasoning += self.buffer[:end].rstrip()
                    self.buffer, self.state = self.buffer[end + len(END):], "gap"
                    continue
                keep = max((k for k in range(1, len(END)) if self.buffer.endswith(END[:k])), default=0)
                keep += len(self.buffer) - keep - len(self.buffer[:len(self.buffer) - keep].rstrip())
                reasoning += self.buffer[:len(self.buffer) - keep]
                self.buffer = self.buffer[len(self.buffer) - keep:]
                break
            else:
                answer, self.buffer = answer + self.buffer, ""
        return reasoning, answer

    def finish(self) -> tuple[str, str]:
        """The text held back, at the end of the reply."""
        rest, self.buffer = self.buffer, ""
        if self.state == "thinking":
            return rest.rstrip(), ""
        return ("", rest.lstrip()) if self.state in ("start", "answer") else ("", "")


__all__ = ["EFFORTS", "EFFORT_BUDGETS", "Thinking", "ThinkingBudget", "ThinkingFormat", "ThinkingSplitter",
           "capped_budget", "effort_thinking", "opens_thinking", "reasoning_tokens", "template_closing",
           "thinking_format"]

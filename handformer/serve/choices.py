"""From engine tokens to OpenAI choices: a `ChoiceSink` per choice turns tokens into text deltas
on the engine thread and hands them to the request's asyncio queue (never blocking the event
loop); `Choices` gathers them into a whole response or into stream chunks, in the completions or
the chat schema. A chat choice with tools reads its text through a `ToolCallParser`: the calls
come out as `tool_calls` (streamed as OpenAI streams them: each call in one delta with its id,
name and arguments) and the rest as content. A choice of a run that thinks reads its text through
a `ThinkingSplitter` first: its reasoning comes out as `reasoning_content` (serve/thinking.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from handformer.generation.tool_calls import Call, ToolCallParser
from handformer.serve.text import IncrementalText
from handformer.serve.thinking import ThinkingSplitter


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]]
    offset: int  # where the token's text starts in the choice's text


@dataclass
class Event:
    kind: str  # "token", "finish", "error", or "gone" (the client went away: watch_client)
    index: int  # the choice
    text: str = ""
    logprob: TokenLogprob | None = None
    reason: str | None = None  # finish: "stop" or "length"; error: the message
    calls: list[Call] = field(default_factory=list)  # tool calls completed with this event
    status: int = 500  # error: the HTTP status it stands for
    reasoning: str = ""  # the reasoning's text, for a run that thinks
    stop: str | None = None  # finish: the stop string that ended the text, if one did


class ChoiceSink:
    """The engine's `TokenSink` for one choice; every call runs on the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue, index: int,
                 text: IncrementalText, token_text: Callable[[int], str],
                 tools: ToolCallParser | None = None, thinking: ThinkingSplitter | None = None) -> None:
        self.loop, self.queue, self.index = loop, queue, index
        self.text, self.token_text, self.tools, self.thinking = text, token_text, tools, thinking

    def token(self, token_id: int, logprob: float | None, top: list[tuple[int, float]] | None,
              is_stop_token: bool) -> bool:
        if is_stop_token:  # an end token ends the choice; it is not part of its text
            return False
        offset = len(self.text.text)
        delta, stopped = self.text.push(token_id)
        reasoning, delta = self.thinking.feed(delta) if self.thinking is not None else ("", delta)
        calls: list[Call] = []
        if self.tools is not None:
            delta, calls = self.tools.feed(delta)
        entry = None
        if logprob is not None:
            entry = TokenLogprob(self.token_text(token_id), logprob,
                                 [(self.token_text(i), lp) for i, lp in top or []], offset)
        if delta or reasoning or entry is not None or calls:
            self._put(Event("token", self.index, delta, entry, calls=calls, reasoning=reasoning))
        return stopped

    def finish(self, reason: str) -> None:
        text, calls, reasoning = self.text.flush(), [], ""
        if self.thinking is not None:
            reasoning, text = self.thinking.feed(text)
            more_reasoning, rest = self.thinking.finish()
            reasoning, text = reasoning + more_reasoning, text + rest
        if self.tools is not None:
            text, calls = self.tools.feed(text)
            rest, more = self.tools.finish(cut=reason == "length")
            text, calls = text + rest, calls + more
        self._put(Event("finish", self.index, text, reason=reason, calls=calls, reasoning=reasoning,
                        stop=self.text.matched))

    def fail(self, message: str, status: int = 500) -> None:
        self._put(Event("error", self.index, reason=message, status=status))

    def _put(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server has stopped
            pass


async def watch_client(request: Any, queue: asyncio.Queue, cancel: Callable[[], None]) -> None:
    """When the request's client disconnects: `cancel()` (its sequences leave the batch at the
    engine's next step), then a "gone" event in `queue`. A non-streaming route runs it as a task
    beside its wait for the engine's events, and cancels it when done, so a request ends the
    moment its client leaves, however fast its tokens flow. (A streamed response needs none:
    Starlette cancels its generator when the client leaves.)"""
    while (await request.receive())["type"] != "http.disconnect":
        pass  # the body is read already: the server has nothing else to hand over
    cancel()
    queue.put_nowait(Event("gone", -1))


def completion_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries], "text_offset": [e.offset for e in entries]}


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    def item(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                        for e in entries]}


@dataclass
class ChoiceState:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's tool_calls entries


def tool_call(call: Call) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json}}


def finish_reason(reason: str | None, calls: list) -> str | None:
    """A reply that ends after its tool calls finishes with "tool_calls", as OpenAI's."""
    return "tool_calls" if calls and reason == "stop" else reason


class Choices:
    """The choices of one request, in the completions ("text") or chat ("chat") schema."""

    def __init__(self, schema: str, count: int, want_logprobs: bool, forced_calls: bool = False) -> None:
        """`forced_calls`: the replies are tool calls only (a reply cut before its call is whole
        has `content` null and no `tool_calls`)."""
        self.schema, self.want_logprobs, self.forced_calls = schema, want_logprobs, forced_calls
        self.states = [ChoiceState() for _ in range(count)]

    def add(self, event: Event) -> list[dict[str, Any]]:
        """Take in an event; returns its tool calls as OpenAI's entries."""
        state = self.states[event.index]
        state.text.append(event.text)
        state.reasoning.append(event.reasoning)
        if event.logprob is not None:
            state.logprobs.append(event.logprob)
        calls = [tool_call(c) for c in event.calls]
        state.calls += calls
        if event.kind == "finish":
            state.finish_reason = event.reason
        return calls

    def _logprobs(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.want_logprobs:
            return None
        return completion_logprobs(entries) if self.schema == "text" else chat_logprobs(entries)

    def whole(self) -> list[dict[str, Any]]:
        """Every choice of a finished request."""
        out = []
        for i, s in enumerate(self.states):
            text = "".join(s.text)
            if self.schema == "text":
                body: dict[str, Any] = {"text": text}
            else:
                empty = s.calls or self.forced_calls
                message = {"role": "assistant", "content": text if text or not empty else None}
                if any(s.reasoning):
                    message["reasoning_content"] = "".join(s.reasoning)
                body = {"message": message | ({"tool_calls": s.calls} if s.calls else {})}
            out.append({"index": i, **body, "logprobs": self._logprobs(s.logprobs),
                        "finish_reason": finish_reason(s.finish_reason, s.calls)})
        return out

    def chunk(self, event: Event, first: bool) -> dict[str, Any]:
        """One choice of a stream chunk for `event`, after `add` (`first`: the choice's first
        chunk)."""
        state = self.states[event.index]
        entries = [event.logprob] if event.logprob is not None else []
        if self.schema == "text":
            body: dict[str, Any] = {"text": event.text}
        else:
            delta = ({"role": "assistant"} if first else {}) | (
                {"content": event.text} if event.text or (first and not event.calls) else {}) | (
                {"reasoning_content": event.reasoning} if event.reasoning else {})
            if event.calls:
                start = len(state.calls) - len(event.calls)
                delta["tool_calls"] = [{"index": start + k, **c} for k, c in enumerate(state.calls[start:])]
            body = {"delta": delta}
        reason = finish_reason(event.reason, state.calls) if event.kind == "finish" else None
        return {"index": event.index, **body, "logprobs": self._logprobs(entries) if entries else None,
                "finish_reason": reason}


__all__ = ["ChoiceSink", "Choices", "Event", "TokenLogprob", "chat_logprobs", "completion_logprobs",
           "watch_client"]

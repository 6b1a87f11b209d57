"""A chat reply as the Responses and Messages APIs show it: an ordered list of parts (reasoning,
text, tool calls), each opened, grown by deltas and closed. The Responses API names them output
items, Anthropic's Messages API content blocks; both routes read one choice's `Event`s through
`ReplyParts` and only render the steps in their own schema.

    Event(reasoning="Hm", text="")        -> open reasoning, delta "Hm"
    Event(text="Hi", calls=[get_time])    -> close reasoning, open text, delta "Hi", close text,
                                             open call, delta (its arguments), close call
    Event(kind="finish")                  -> close what is open
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from handformer.serve.choices import Event, watch_client
from handformer.serve.errors import APIError, error_code

log = logging.getLogger("handformer.serve")


@dataclass
class Part:
    kind: str  # "reasoning", "text" or "call"
    index: int  # its place among the reply's parts
    text: str = ""  # the reasoning, the text, or a call's arguments (JSON text)
    name: str = ""  # a call's function
    call_id: str = ""  # a call's id, as the next request names it


@dataclass
class Step:
    action: str  # "open", "delta" or "close"
    part: Part
    delta: str = ""


class ReplyParts:
    """One choice's events -> the steps of its parts (see the module docstring)."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.open: Part | None = None

    def feed(self, event: Event) -> list[Step]:
        steps: list[Step] = []
        if event.reasoning:
            steps += self._grow("reasoning", event.reasoning)
        if event.text:
            steps += self._grow("text", event.text)
        for call in event.calls:
            steps += self._close()
            call_id = f"call_{uuid.uuid4().hex[:24]}"
            part = Part("call", len(self.parts), call.arguments_json, call.name, call_id)
            self.parts.append(part)
            steps += [Step("open", part), Step("delta", part, part.text), Step("close", part)]
        if event.kind == "finish":
            steps += self._close()
        return steps

    def _grow(self, kind: str, text: str) -> list[Step]:
        steps: list[Step] = []
        if self.open is None or self.open.kind != kind:
            steps += self._close()
            self.open = Part(kind, len(self.parts))
            self.parts.append(self.open)
            steps.append(Step("open", self.open))
        self.open.text += text
        return steps + [Step("delta", self.open, text)]

    def _close(self) -> list[Step]:
        if self.open is None:
            return []
        part, self.open = self.open, None
        return [Step("close", part)]

    def text(self) -> str:
        return "".join(p.text for p in self.parts if p.kind == "text")

    def calls(self) -> list[Part]:
        return [p for p in self.parts if p.kind == "call"]


async def events(request: Request, seqs: list, queue: asyncio.Queue, watch: bool) -> AsyncIterator[Event]:
    """One choice's events until it finishes; an error event raises its APIError. `watch`: a whole
    reply is cancelled the moment its client leaves (choices.watch_client; a stream's generator is
    cancelled by Starlette). However it ends, its sequence leaves the batch."""
    watcher = asyncio.create_task(watch_client(request, queue, lambda: [s.cancel() for s in seqs])) \
        if watch else None
    try:
        while True:
            event = await queue.get()
            if event.kind == "gone":
                log.info("%s: the client went away; its sequence is cancelled (499)", request.url.path)
                raise APIError(499, "the client went away")
            if event.kind == "error":
                raise APIError(event.status, event.reason, code=error_code(event.status, event.reason))
            yield event
            if event.kind == "finish":
                return
    finally:
        if watcher is not None:
            watcher.cancel()
        while seqs:
            seqs.pop().cancel()


__all__ = ["Part", "ReplyParts", "Step", "events"]

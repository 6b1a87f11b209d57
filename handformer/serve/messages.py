"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the chat
path (what the `anthropic` client, Claude Code and the Agent SDK speak). The body becomes a chat
request (serve/messages_request.py) and decodes as /v1/chat/completions does; its reply parts
(serve/reply_parts.py) become content blocks: `thinking` (a run that thinks), `text` and
`tool_use`. Errors come in Anthropic's shape (serve/errors.py).

    finish          stop_reason
    end token       "end_turn" ("tool_use" when the reply called tools)
    stop sequence   "stop_sequence" (and stop_sequence names it)
    max_tokens      "max_tokens"

Streamed, a reply is message_start, then content_block_start / _delta / _stop for each block,
message_delta (stop_reason, usage) and message_stop.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from handformer.serve.door import APIError, error_body
from handformer.serve.messages_request import parse_count_tokens, parse_messages
from handformer.serve.reply_parts import Part, ReplyParts, Step, events


def block(part: Part, done: bool) -> dict[str, Any]:
    """A part as Anthropic's content block (whole when `done`, else as content_block_start opens it)."""
    if part.kind == "reasoning":
        return {"type": "thinking", "thinking": part.text if done else "", "signature": ""}
    if part.kind == "text":
        return {"type": "text", "text": part.text if done else ""}
    return {"type": "tool_use", "id": "toolu_" + part.call_id.removeprefix("call_"), "name": part.name,
            "input": json.loads(part.text) if done else {}}


def stop_reason(reason: str | None, stop: str | None, parts: ReplyParts) -> str:
    if reason == "length":
        return "max_tokens"
    if stop is not None:
        return "stop_sequence"
    return "tool_use" if parts.calls() else "end_turn"


def usage_of(chat_usage: dict[str, Any]) -> dict[str, int]:
    return {"input_tokens": chat_usage["prompt_tokens"], "output_tokens": chat_usage["completion_tokens"],
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def step_event(step: Step) -> dict[str, Any]:
    index = step.part.index
    if step.action == "open":
        return {"type": "content_block_start", "index": index, "content_block": block(step.part, False)}
    if step.action == "close":
        return {"type": "content_block_stop", "index": index}
    delta = {"reasoning": {"type": "thinking_delta", "thinking": step.delta},
             "text": {"type": "text_delta", "text": step.delta},
             "call": {"type": "input_json_delta", "partial_json": step.delta}}[step.part.kind]
    return {"type": "content_block_delta", "index": index, "delta": delta}


def sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


class MessagesRoutes:
    def __init__(self, routes: Any) -> None:
        self.routes = routes

    async def create(self, request: Request) -> Any:
        chat = parse_messages(await self.routes.body(request))
        plan = await self.routes.prepare_chat(chat)
        seqs, queue, usage = self.routes.submit(request, plan, chat)
        head = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                "model": plan.served.id}
        replies = events(request, list(seqs), queue, watch=not chat.stream)
        if chat.stream:
            return StreamingResponse(self._stream(head, replies, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        parts, last = ReplyParts(), None
        async for event in replies:
            parts.feed(event)
            last = event
        return {**head, "content": [block(p, True) for p in parts.parts],
                "stop_reason": stop_reason(last.reason, last.stop, parts), "stop_sequence": last.stop,
                "usage": usage_of(usage())}

    async def _stream(self, head: dict[str, Any], replies: AsyncIterator, usage: Any) -> AsyncIterator[str]:
        parts, last = ReplyParts(), None
        start = usage_of(usage()) | {"output_tokens": 0}
        yield sse({"type": "message_start", "message": {**head, "content": [], "stop_reason": None,
                                                        "stop_sequence": None, "usage": start}})
        try:
            async for event in replies:
                last = event
                for step in parts.feed(event):
                    yield sse(step_event(step))
        except APIError as err:
            yield sse(error_body(err.status, err.message, path="/v1/messages"))
            return
        yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason(last.reason, last.stop,
                                                                                 parts),
                                                      "stop_sequence": last.stop},
                   "usage": {"output_tokens": usage()["completion_tokens"]}})
        yield sse({"type": "message_stop"})

    async def count_tokens(self, request: Request) -> dict[str, int]:
        chat = parse_count_tokens(await self.routes.body(request))
        return {"input_tokens": len(self.routes.render_chat(chat)[4])}


def add_messages_routes(api: APIRouter, routes: Any) -> MessagesRoutes:
    """POST /v1/messages and /v1/messages/count_tokens on the /v1 router."""
    handler = MessagesRoutes(routes)
    api.add_api_route("/messages", handler.create, methods=["POST"])
    api.add_api_route("/messages/count_tokens", handler.count_tokens, methods=["POST"])
    return handler


__all__ = ["MessagesRoutes", "add_messages_routes"]

"""`POST /v1/responses`: OpenAI's Responses API over the chat path (what the Agents SDK, pydantic-ai's
OpenAIResponsesModel and the Codex CLI speak). The body becomes a chat request
(serve/responses_request.py), decodes as /v1/chat/completions does, and its reply parts
(serve/reply_parts.py) become output items: a reasoning item (a run that thinks), message items
(output_text) and function_call items.

    GET    /v1/responses/{id}    a stored response
    DELETE /v1/responses/{id}    forget it

`store` (true by default) keeps the response and its conversation in memory, the latest
MAX_STORED for MAX_AGE_S seconds, so that `previous_response_id` continues it (tool outputs
included); an unknown or expired id is a 404. Streamed, a response is the events the official
client's `responses.stream` and the Agents SDK read, each with its `sequence_number`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from handformer.serve.door import APIError, error_body
from handformer.serve.reply_parts import Part, ReplyParts, Step, events
from handformer.serve.responses_request import ResponsesRequest, parse_responses

MAX_STORED = 1000  # responses kept for previous_response_id
MAX_AGE_S = 3600.0


class ResponseStore:
    """Stored responses and their conversations (chat messages), the latest MAX_STORED for MAX_AGE_S."""

    def __init__(self, max_stored: int = MAX_STORED, max_age_s: float = MAX_AGE_S) -> None:
        self.max_stored, self.max_age_s = max_stored, max_age_s
        self._items: OrderedDict[str, tuple[float, dict[str, Any], list[dict[str, Any]]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response["id"]] = (time.monotonic(), response, messages)
            while len(self._items) > self.max_stored:
                self._items.popitem(last=False)

    def get(self, response_id: str, param: str = "previous_response_id") -> tuple[dict, list[dict[str, Any]]]:
        with self._lock:
            now = time.monotonic()
            while self._items and now - next(iter(self._items.values()))[0] > self.max_age_s:
                self._items.popitem(last=False)
            found = self._items.get(response_id)
        if found is None:
            raise APIError(404,
                           f"no response {response_id!r} is stored here (responses are kept in memory, "
                           f"the latest {self.max_stored} for {self.max_age_s:.0f} s, and only with store: "
                           "true); "
                           "send the whole conversation as input instead", param, "response_not_found")
        return found[1], found[2]

    def delete(self, response_id: str) -> None:
        self.get(response_id, "response_id")
        with self._lock:
            self._items.pop(response_id, None)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """One response: its output items grown from the reply's steps, and the whole object."""

    def __init__(self, req: ResponsesRequest, model: str) -> None:
        self.req, self.model = req, model
        self.id, self.created = _new_id("resp"), int(time.time())
        self.parts = ReplyParts()
        self.item_ids: dict[int, str] = {}  # part index -> item id

    def item(self, part: Part, done: bool) -> dict[str, Any]:
        item_id = self.item_ids.setdefault(part.index, _new_id(
            {"reasoning": "rs", "text": "msg", "call": "fc"}[part.kind]))
        status = "completed" if done else "in_progress"
        if part.kind == "reasoning":
            return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
                    "content": [{"type": "reasoning_text", "text": part.text}] if done else []}
        if part.kind == "text":
            return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                    "content": [output_text(part.text)] if done else []}
        return {"type": "function_call", "id": item_id, "call_id": part.call_id, "name": part.name,
                "arguments": part.text if done else "", "status": status}

    def response(self, status: str, usage: dict[str, Any] | None, reason: str | None = None) -> dict[str,
                                                                                                     Any]:
        chat, req = self.req.chat, self.req
        fmt = chat.response_format
        text_format = {"type": "text"} if fmt is None else {"type": "json_object"} \
            if fmt.type == "json_object" else {"type": "json_schema", "name": fmt.name, "schema": fmt.schema,
                                               "strict": True}
        done = status != "in_progress"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": [self.item(p, True) for p in self.parts.parts] if done else [],
            "usage": usage, "error": None,
            "incomplete_details": {"reason": reason} if status == "incomplete" else None,
            "instructions": req.instructions, "max_output_tokens": chat.max_tokens,
            "previous_response_id": req.previous_response_id, "temperature": chat.sampling.temperature,
            "top_p": chat.sampling.top_p if chat.sampling.top_p is not None else 1.0,
            "parallel_tool_calls": chat.parallel_tool_calls,
            "tool_choice": chat.tool_choice if chat.tool_choice in ("auto", "none", "required")
            else {"type": "function", "name": chat.tool_choice},
            "tools": [{"type": "function", "name": t.name, "description": t.description,
                       "parameters": t.parameters,
                       "strict": False} for t in chat.tools],
            "text": {"format": text_format}, "reasoning": {"effort": req.effort, "summary": None},
            "store": req.store, "metadata": req.metadata, "truncation": "disabled"}

    def messages(self) -> list[dict[str, Any]]:
        """The reply as the chat messages that continue the conversation (reasoning left out)."""
        calls = [{"id": p.call_id, "type": "function", "function": {"name": p.name,
                                                                    "arguments": json.loads(p.text)}}
                 for p in self.parts.calls()]
        return [{"role": "assistant",
                 "content": self.parts.text()} | ({"tool_calls": calls} if calls else {})]


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage_of(chat_usage: dict[str, Any]) -> dict[str, Any]:
    details = chat_usage.get("completion_tokens_details") or {}
    return {"input_tokens": chat_usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
            "total_tokens": chat_usage["total_tokens"]}


def step_events(builder: ResponseBuilder, step: Step) -> list[dict[str, Any]]:
    """The stream events of one step (sequence numbers are added by the caller)."""
    part = step.part
    item = builder.item(part, step.action == "close")
    at = {"item_id": item["id"], "output_index": part.index}
    if step.action == "open":
        out = [{"type": "response.output_item.added", "output_index": part.index, "item": item}]
        if part.kind == "text":
            out.append({"type": "response.content_part.added", **at, "content_index": 0,
                        "part": output_text("")})
        return out
    if step.action == "delta":
        kind = {"reasoning": "response.reasoning_text.delta", "text": "response.output_text.delta",
                "call": "response.function_call_arguments.delta"}[part.kind]
        extra = {"content_index": 0} | ({"logprobs": []} if part.kind == "text" else {})
        return [{"type": kind, **at, **(extra if part.kind != "call" else {}), "delta": step.delta}]
    if part.kind == "reasoning":
        out = [{"type": "response.reasoning_text.done", **at, "content_index": 0, "text": part.text}]
    elif part.kind == "text":
        out = [{"type": "response.output_text.done", **at, "content_index": 0, "text": part.text,
                "logprobs": []},
               {"type": "response.content_part.done", **at, "content_index": 0,
                "part": output_text(part.text)}]
    else:
        out = [{"type": "response.function_call_arguments.done", **at, "name": part.name,
                "arguments": part.text}]
    return out + [{"type": "response.output_item.done", "output_index": part.index, "item": item}]


class ResponsesRoutes:
    def __init__(self, routes: Any) -> None:
        self.routes, self.store = routes, ResponseStore()

    async def create(self, request: Request) -> Any:
        req = parse_responses(await self.routes.body(request))
        history = self.store.get(req.previous_response_id)[1] if req.previous_response_id else []
        conversation = history + req.chat.messages
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        req.chat.messages = system + conversation
        if not conversation:
            raise APIError(400, "input is empty and there is no previous_response_id; give some input",
                           "input")
        plan = await self.routes.prepare_chat(req.chat)
        seqs, queue, usage = self.routes.submit(request, plan, req.chat)
        builder = ResponseBuilder(req, plan.served.id)
        replies = events(request, list(seqs), queue, watch=not req.chat.stream)
        if req.chat.stream:
            return StreamingResponse(self._stream(builder, replies, usage, conversation),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        reason = None
        async for event in replies:
            builder.parts.feed(event)
            reason = event.reason
        return self._finish(builder, reason, usage(), conversation)

    def _finish(self, builder: ResponseBuilder, reason: str | None, usage: dict, conversation: list) -> dict:
        incomplete = reason == "length"
        response = builder.response("incomplete" if incomplete else "completed", usage_of(usage),
                                    "max_output_tokens" if incomplete else None)
        if builder.req.store:
            self.store.put(response, conversation + builder.messages())
        return response

    async def _stream(self, builder: ResponseBuilder, replies: AsyncIterator, usage: Any,
                      conversation: list) -> AsyncIterator[str]:
        number = 0

        def sse(event: dict[str, Any]) -> str:
            nonlocal number
            event["sequence_number"], number = number, number + 1
            return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"

        start = builder.response("in_progress", None)
        yield sse({"type": "response.created", "response": start})
        yield sse({"type": "response.in_progress", "response": start})
        reason = None
        try:
            async for event in replies:
                reason = event.reason
                for step in builder.parts.feed(event):
                    for out in step_events(builder, step):
                        yield sse(out)
        except APIError as err:
            body = error_body(err.status, err.message, err.param, err.code)["error"]
            yield sse({"type": "error", "code": err.code, "message": err.message, "param": body["param"]})
            return
        # "response.completed" even when max_output_tokens cut the reply (its status says
        # "incomplete"): the official client's accumulator ends on no other event
        yield sse({"type": "response.completed", "response": self._finish(builder, reason, usage(),
                                                                          conversation)})

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        return self.store.get(response_id, "response_id")[0]

    async def delete(self, response_id: str) -> dict[str, Any]:
        self.store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}


def add_responses_routes(api: APIRouter, routes: Any) -> ResponsesRoutes:
    """POST /v1/responses, GET and DELETE /v1/responses/{id} on the /v1 router."""
    handler = ResponsesRoutes(routes)
    api.add_api_route("/responses", handler.create, methods=["POST"])
    api.add_api_route("/responses/{response_id}", handler.retrieve, methods=["GET"])
    api.add_api_route("/responses/{response_id}", handler.delete, methods=["DELETE"])
    return handler


__all__ = ["ResponseStore", "ResponsesRoutes", "add_responses_routes"]

"""The body of `POST /v1/responses` (OpenAI's Responses API) read into a chat request.

    input                  a string (one user message) or a list of items: messages (roles user,
                           assistant, system, developer; text parts), function_call and
                           function_call_output items; reasoning items are dropped (the template
                           does not show past reasoning)
    instructions           a system message before the input (not carried by previous_response_id)
    tools, tool_choice     function tools; "auto", "none", "required" or {"type": "function", "name"}
    text.format            {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name",
                           "schema", "strict", "description"}
    reasoning.effort       the thinking budget (serve/thinking.py)
    max_output_tokens, temperature, top_p, stream, store, previous_response_id

Accepted and ignored, as the official SDKs send them: include, metadata (echoed back),
parallel_tool_calls, truncation, service_tier, user, prompt_cache_key, safety_identifier,
stream_options, top_logprobs 0, background false, reasoning.summary. Any other field is a 400.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from handformer.generation.tool_calls import Tool
from handformer.serve.door import APIError, Fields, read_sampling
from handformer.serve.door import show as _show
from handformer.serve.openai_schema import TOOL_NAME, ChatRequest, ResponseFormat, check_tool_name
from handformer.serve.thinking import EFFORTS, effort_thinking

IGNORED = {"include", "metadata", "truncation", "service_tier", "user", "prompt_cache_key",
           "safety_identifier",
           "stream_options", "top_logprobs", "background", "parallel_tool_calls"}
KNOWN = IGNORED | {"model", "input", "instructions", "tools", "tool_choice", "text", "max_output_tokens",
                   "temperature", "top_p", "store", "previous_response_id", "stream", "reasoning"}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = {"input_text", "output_text", "text", "refusal"}


@dataclass
class ResponsesRequest:
    chat: ChatRequest  # messages: this request's input only (the route adds history and instructions)
    instructions: str | None = None
    store: bool = True
    previous_response_id: str | None = None
    effort: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    echo: dict[str, Any] = field(default_factory=dict)  # fields the response repeats as they came


def parse_responses(body: dict[str, Any]) -> ResponsesRequest:
    f = Fields(body, KNOWN)
    chat = ChatRequest(model=f.string("model", required=True), fit_context=True)
    chat.max_tokens = f.integer("max_output_tokens", 1)
    chat.sampling = read_sampling(f, max_temperature=2)
    chat.stream = f.boolean("stream")
    chat.messages = input_messages(body.get("input"))
    chat.tools = _tools(body.get("tools"))
    chat.tool_choice = _tool_choice(body.get("tool_choice"), chat.tools)
    chat.response_format = _text_format(body.get("text"))
    chat.parallel_tool_calls = f.boolean("parallel_tool_calls", default=True)
    effort = _effort(body.get("reasoning"))
    chat.thinking = effort_thinking(effort)
    _check_ignored(f)
    request = ResponsesRequest(chat, f.string("instructions"), f.boolean("store", default=True),
                               f.string("previous_response_id"), effort)
    request.metadata = body.get("metadata") or {}  # checked: an object or null
    return request


def _check_ignored(f: Fields) -> None:
    """The ignored fields still hold what their names say (a 400 otherwise)."""
    for name, kind, wanted in (("metadata", dict, "an object of strings"), ("include", list, "a list"),
                               ("stream_options", dict, "an object")):
        if not isinstance(f.body.get(name, kind()), (kind, type(None))):
            raise f.fail(name, wanted)
    for name in ("truncation", "service_tier", "user", "prompt_cache_key", "safety_identifier"):
        if f.body.get(name) is not None and not isinstance(f.body[name], str):
            raise f.fail(name, "a string")
    f.integer("top_logprobs", 0, 0)
    f.unsupported("background", lambda v: v is False)


def _effort(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"effort", "summary", "generate_summary"} or \
            value.get("effort") not in (None, *EFFORTS):
        raise APIError(400, 'reasoning must be {"effort": ' + " | ".join(f'"{e}"' for e in EFFORTS)
                       + f'}}, got {_show(value)}', "reasoning")
    return value.get("effort")


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` as chat messages (a function_call joins the assistant message before it)."""
    if value is None:  # previous_response_id's conversation alone
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise APIError(400, f"input must be a string or a list of items, got {_show(value)}", "input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise APIError(400, f"{where} must be an object, got {_show(item)}", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": _role(item, where), "content": _content(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _text(item, "call_id", where), "type": "function",
                    "function": {"name": _text(item, "name", where), "arguments": _arguments(item, where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _text(item, "call_id", where),
                             "content": _content(item.get("output"), where, "output")})
        elif kind != "reasoning":
            raise APIError(400, f'{where}.type {_show(kind)} is not supported here; send "message", '
                           '"function_call" or "function_call_output" items', f"{where}.type")
    return messages


def _role(item: dict[str, Any], where: str) -> str:
    role = item.get("role")
    if role not in ROLES:
        raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}, got {_show(role)}",
                       f"{where}.role")
    return ROLES[role]


def _content(value: Any, where: str, name: str = "content") -> str:
    """A string, or text parts (input_text, output_text) joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in value):
        texts = [p.get("text", p.get("refusal")) for p in value]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise APIError(400, f'{where}.{name} must be a string or a list of {{"type": "input_text", "text": ...}} '
                   f"parts (this model reads text only), got {_show(value)}", f"{where}.{name}")


def _text(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise APIError(400, f"{where}.{name} must be a non-empty string, got {_show(value)}",
                       f"{where}.{name}")
    return value


def _arguments(item: dict[str, Any], where: str) -> dict[str, Any]:
    try:
        arguments = json.loads(_text(item, "arguments", where))
    except (ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        raise APIError(400, f"{where}.arguments must be a JSON object written as a string, got "
                       f"{_show(item.get('arguments'))}", f"{where}.arguments")
    return arguments


def _tools(value: Any) -> list[Tool]:
    """Function tools: {"type": "function", "name", "description", "parameters", "strict"}."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError(400, f"tools must be a list, got {_show(value)}", "tools")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or \
                set(tool) - {"type", "name", "description", "parameters", "strict"}:
            raise APIError(400,
                           f'{where} must be a function tool {{"type": "function", "name", "parameters", '
                           f'"description", "strict"}} (no other kind is served), got {_show(tool)}', where)
        name = check_tool_name(tool.get("name"), tools, f"{where}.name")
        parameters = tool.get("parameters")
        parameters = {"type": "object", "properties": {}} if parameters is None else parameters
        text, strict = tool.get("description"), tool.get("strict")
        if not isinstance(parameters, dict) or not isinstance(text, (str, type(None))) \
                or not isinstance(strict, (bool, type(None))):
            raise APIError(400, f"{where}: parameters must be a JSON schema (an object), description a "
                           "string, strict true or false", where)
        tools.append(Tool(name, tool.get("description"), parameters))
    return tools


def _tool_choice(value: Any, tools: list[Tool]) -> str:
    if value is None:
        return "auto" if tools else "none"
    if value in ("auto", "none", "required"):
        choice = value
    elif isinstance(value, dict) and value.get("type") == "function" and set(value) == {"type", "name"} \
            and value["name"] in {t.name for t in tools}:
        choice = value["name"]
    else:
        raise APIError(400, 'tool_choice must be "auto", "none", "required" or {"type": "function", "name": '
                       f"<one of tools>}}, got {_show(value)}", "tool_choice")
    if not tools:
        return "none"
    return choice


def _text_format(value: Any) -> ResponseFormat | None:
    """text: {"format": ..., "verbosity": ...} (verbosity changes nothing here)."""
    if value is None:
        return None
    known = isinstance(value, dict) and not set(value) - {"format", "verbosity"}
    fmt = value.get("format") if known else False
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return None if kind == "text" else ResponseFormat("json_object", field="text.format")
    keys = set(fmt) if isinstance(fmt, dict) else set()
    if kind == "json_schema" and {"type", "name", "schema"} <= keys <= {"type", "name", "schema", "strict",
                                                                        "description"} \
            and isinstance(fmt["name"], str) and TOOL_NAME.fullmatch(fmt["name"]) \
            and isinstance(fmt["schema"], dict) and isinstance(fmt.get("strict"), (bool, type(None))) \
            and isinstance(fmt.get("description"), (str, type(None))):
        return ResponseFormat("json_schema", fmt["schema"], fmt["name"], "text.format", "text.format.schema")
    raise APIError(400, 'text must be {"format": {"type": "text"}}, {"format": {"type": "json_object"}} or '
                   '{"format": {"type": "json_schema", "name": ..., "schema": {...}}}, got '
                   f"{_show(value)}", "text.format")


__all__ = ["ResponsesRequest", "input_messages", "parse_responses"]

"""The body of `POST /v1/messages` (Anthropic's Messages API) read into a chat request.

    system              a string or text blocks: the system message
    messages            roles user and assistant; content a string or blocks: text, tool_use (an
                        assistant's call), tool_result (a user's answer to one, a string or text
                        blocks); thinking blocks of earlier turns are dropped
    tools               {"name", "description", "input_schema"}: function tools
    tool_choice         {"type": "auto" | "any" | "tool" (with "name") | "none",
                         "disable_parallel_tool_use"}
    thinking            {"type": "enabled", "budget_tokens": N} (N < max_tokens; Anthropic's own
                        minimum of 1024 is not asked, a small model's context is smaller), or
                        {"type": "disabled"}; left out, the reply does not think
    max_tokens          required; cut to what fits in the context
    stop_sequences, stream, temperature (0 to 1), top_p, top_k

Accepted and ignored: metadata, service_tier, cache_control and citations on blocks. Any other
field is a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from handformer.generation.tool_calls import Tool
from handformer.serve.door import APIError, Fields, read_sampling
from handformer.serve.door import show as _show
from handformer.serve.openai_schema import (
    MAX_STOP,
    ChatRequest,
    ResponseFormat,
    check_tool_name,
    unmatched_tool_result,
)
from handformer.serve.thinking import EFFORT_BUDGETS, Thinking

IGNORED = {"metadata", "service_tier", "cache_control", "inference_geo", "speed"}
SAMPLING = {"max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k"} | IGNORED
PROMPT = {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"}
MAX_EFFORT_BUDGET = 32768  # output_config.effort "max"
BLOCK_EXTRAS = {"cache_control", "citations"}


def parse_messages(body: dict[str, Any]) -> ChatRequest:
    f = Fields(body, PROMPT | SAMPLING)
    chat = _prompt(f)
    if body.get("max_tokens") is None:
        raise APIError(400, "max_tokens: Field required (the most tokens the reply may have)", "max_tokens")
    chat.max_tokens = f.integer("max_tokens", 1)
    chat.sampling = read_sampling(f, max_temperature=1)  # Anthropic's range
    chat.stream = f.boolean("stream")
    stops = body.get("stop_sequences")
    stops = [] if stops is None else stops
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) and s
                                                                        for s in stops):
        raise f.fail("stop_sequences", f"a list of at most {MAX_STOP} non-empty strings")
    chat.stop = stops
    for name in ("metadata", "cache_control"):
        if not isinstance(body.get(name), (dict, type(None))):
            raise f.fail(name, "an object")
    for name in ("service_tier", "inference_geo", "speed"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise f.fail(name, "a string")
    budget = body["thinking"].get("budget_tokens") if isinstance(body.get("thinking"), dict) else None
    if budget is not None and budget >= chat.max_tokens:  # an explicit budget (an effort's is capped)
        raise APIError(400, f"thinking.budget_tokens ({budget}) must be less than max_tokens "
                       f"({chat.max_tokens})", "thinking.budget_tokens")
    return chat


def parse_count_tokens(body: dict[str, Any]) -> ChatRequest:
    return _prompt(Fields(body, PROMPT))


def _prompt(f: Fields) -> ChatRequest:
    chat = ChatRequest(model=f.string("model", required=True), fit_context=True)
    system = _system(f.body.get("system"))
    chat.messages = system + _messages(f.body.get("messages"))
    if (unmatched := unmatched_tool_result(chat.messages)) is not None:
        _, given, called = unmatched
        earlier = f"the earlier ones are {', '.join(map(repr, called))}" if called else "there is none"
        raise APIError(400, f"a tool_result's tool_use_id {given!r} matches no earlier tool_use block "
                       f"({earlier}); send the assistant message with that tool_use before its result",
                       "messages")
    chat.tools = _tools(f.body.get("tools"))
    chat.tool_choice, chat.parallel_tool_calls = _tool_choice(f.body.get("tool_choice"), chat.tools)
    effort, chat.response_format = _output_config(f.body.get("output_config"))
    chat.thinking = _thinking(f.body.get("thinking"), effort)
    return chat


def _output_config(value: Any) -> tuple[str | None, ResponseFormat | None]:
    """output_config: {"effort": ..., "format": {"type": "json_schema", "schema": {...}}}."""
    if value is None:
        return None, None
    fmt = value.get("format") if isinstance(value, dict) else None
    ok = isinstance(value, dict) and not set(value) - {"effort", "format"} \
        and value.get("effort") in (None, *EFFORT_BUDGETS, "max") and (fmt is None or (
            isinstance(fmt, dict) and set(fmt) == {"type", "schema"} and fmt["type"] == "json_schema"
            and isinstance(fmt["schema"], dict)))
    if not ok:
        raise APIError(400, 'output_config must be {"effort": "low" | "medium" | "high" | "xhigh" | "max", '
                       f'"format": {{"type": "json_schema", "schema": {{...}}}}}}, got {_show(value)}',
                       "output_config")
    answer = None if fmt is None else ResponseFormat("json_schema", fmt["schema"], "output",
                                                     "output_config.format", "output_config.format.schema")
    return value.get("effort"), answer


def _system(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    return [{"role": "system", "content": _text_blocks(value, "system")}]


def _text_blocks(value: Any, where: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                       and isinstance(b.get("text"), str) for b in value):
        return "".join(b["text"] for b in value)
    raise APIError(400, f'{where} must be a string or a list of {{"type": "text", "text": ...}} blocks '
                   f"(this model reads text only), got {_show(value)}", where)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise APIError(400,
                       'messages must be a non-empty list of {"role": "user" | "assistant", "content": ...}, '
                       f"got {_show(value)}", "messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or set(message) - {"role", "content"} or \
                message.get("role") not in ("user", "assistant"):
            raise APIError(400, f'{where} must be {{"role": "user" | "assistant", "content": ...}}, got '
                           f"{_show(message)}", where)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise APIError(400, f"{where}.content must be a string or a list of blocks, got {_show(content)}",
                           f"{where}.content")
        out += _turn(message["role"], blocks, where)
    return out


def _turn(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user's tool results become tool messages, an
    assistant's tool_use blocks its tool_calls."""
    allowed = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking",
                                                              "redacted_thinking")}
    texts, calls, results = [], [], []
    for j, b in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if isinstance(b, dict):  # a block sent back as a client read it: its empty fields left out
            b = {k: v for k, v in b.items() if v is not None}
        kind = b.get("type") if isinstance(b, dict) else None
        if kind not in allowed[role]:
            raise APIError(400,
                           f"{at} must be a block of type {' or '.join(allowed[role])} in a {role} message "
                           f"(this model reads text only), got {_show(b)}", at)
        if kind == "text":
            texts.append(_text_blocks([{k: v for k, v in b.items() if k not in BLOCK_EXTRAS}], at))
        elif kind == "tool_use":
            calls.append(_tool_use(b, at))
        elif kind == "tool_result":
            results.append(_tool_result(b, at))
    if role == "assistant":
        return [{"role": "assistant", "content": "".join(texts)} | ({"tool_calls": calls} if calls else {})]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tool_use(b: dict[str, Any], at: str) -> dict[str, Any]:
    if set(b) - {"type", "id", "name", "input", "cache_control"} or not isinstance(b.get("id"), str) \
            or not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
        raise APIError(400,
                       f'{at} must be {{"type": "tool_use", "id": ..., "name": ..., "input": {{...}}}}, got '
                       f"{_show(b)}", at)
    return {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": b["input"]}}


def _tool_result(b: dict[str, Any], at: str) -> dict[str, Any]:
    if set(b) - {"type", "tool_use_id", "content", "is_error", "cache_control"} \
            or not isinstance(b.get("tool_use_id"), str) or not isinstance(b.get("is_error", False), bool):
        raise APIError(400,
                       f'{at} must be {{"type": "tool_result", "tool_use_id": ..., "content": ...}}, got '
                       f"{_show(b)}", at)
    content = b.get("content", "")
    if isinstance(content, list):
        content = [{k: v for k, v in c.items() if k not in BLOCK_EXTRAS} if isinstance(c, dict) else c
                   for c in content]
    text = _text_blocks(content, f"{at}.content")
    return {"role": "tool", "tool_call_id": b["tool_use_id"],
            "content": ("Error: " if b.get("is_error") else "")
            + text}


def _tools(value: Any) -> list[Tool]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise APIError(400, f"tools must be a list, got {_show(value)}", "tools")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom" or \
                set(tool) - {"type", "name", "description", "input_schema", "cache_control"}:
            raise APIError(400,
                           f'{where} must be a client tool {{"name", "description", "input_schema"}} (no '
                           f"server tools here), got {_show(tool)}", where)
        name = check_tool_name(tool.get("name"), tools, f"{where}.name")
        description = tool.get("description")
        if not isinstance(tool.get("input_schema"), dict) or not isinstance(description, (str, type(None))):
            raise APIError(400,
                           f"{where}.input_schema must be a JSON schema (an object) and description a string",
                           f"{where}.input_schema")
        tools.append(Tool(name, tool.get("description"), tool["input_schema"]))
    return tools


def _tool_choice(value: Any, tools: list[Tool]) -> tuple[str, bool]:
    """Anthropic's tool_choice as chat's (and parallel_tool_calls)."""
    if value is None:
        return ("auto" if tools else "none"), True
    kind = value.get("type") if isinstance(value, dict) else None
    keys = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    ok = kind in ("auto", "any", "tool", "none") and not set(value) - keys \
        and isinstance(value.get("disable_parallel_tool_use", False), bool) \
        and (kind != "tool" or value.get("name") in {t.name for t in tools})
    if not ok:
        raise APIError(400,
                       'tool_choice must be {"type": "auto" | "any" | "none"} or {"type": "tool", "name": '
                       f"<one of tools>}}, got {_show(value)}", "tool_choice")
    if kind != "none" and not tools:
        raise APIError(400, f"tool_choice {_show(value)} needs tools; give tools or leave tool_choice out",
                       "tool_choice")
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(kind) or value["name"]
    return choice, not value.get("disable_parallel_tool_use", False)


def _thinking(value: Any, effort: str | None) -> Thinking:
    """Anthropic's thinking: enabled with a budget, adaptive (output_config.effort's budget, or
    none), or disabled; `display` is accepted and the thinking always shown."""
    if value is None or value == {"type": "disabled"}:
        return Thinking(enabled=False)
    kind = value.get("type") if isinstance(value, dict) else None
    keys = set(value) - {"display"} if isinstance(value, dict) else set()
    if kind == "adaptive" and keys == {"type"}:
        return Thinking(budget=EFFORT_BUDGETS.get(effort, MAX_EFFORT_BUDGET) if effort else None)
    budget = value.get("budget_tokens") if isinstance(value, dict) else None
    if kind == "enabled" and keys == {"type", "budget_tokens"} and isinstance(budget, int) \
            and not isinstance(budget, bool) and budget >= 1:
        return Thinking(budget=budget)
    raise APIError(400, 'thinking must be {"type": "enabled", "budget_tokens": <an integer >= 1>}, {"type": '
                   f'"adaptive"}} or {{"type": "disabled"}}, got {_show(value)}', "thinking")


__all__ = ["parse_count_tokens", "parse_messages"]

"""The request bodies of the OpenAI-compatible routes, read into typed dataclasses.

Every field is checked by hand so that each error names the field (`param`) and says what to send
instead, as OpenAI's do. Options the server cannot honour are refused rather than ignored when
they would change the answer (a non-zero penalty, logit_bias, echo); options that change nothing
here (`user`, a zero penalty, `stream_options` without streaming, and the official SDKs' `store`,
`metadata`, `include`, `truncation` and `service_tier`: door.SDK_FIELDS) are accepted. A schema's
own checks (JSON pointers, unsupported keywords) are generation/json_schema.py's, made when the
route compiles it; request_schemas.py writes every body out as a JSON schema.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from handformer.generation.sampling import SamplingOptions
from handformer.generation.tool_calls import Tool
from handformer.serve.door import SDK_FIELDS, APIError, Fields, read_sampling
from handformer.serve.door import show as _show
from handformer.serve.thinking import EFFORTS, Thinking, effort_thinking

MAX_N = 64  # choices per prompt
MAX_STOP = 16  # stop strings
MAX_TOP_LOGPROBS = 20
MAX_INPUTS = 64  # prompts per completion request, texts per translation request
MAX_BEAM = 16
MAX_TOOLS = 128
MAX_EMBED_INPUTS = 256
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name


def check_tool_name(name: Any, tools: list[Tool], where: str) -> str:
    """A tool's `name` at `where`: OpenAI's rule for a function's name, and not one `tools` has."""
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name) or any(t.name == name for t in tools):
        raise APIError(400, f"{where} must be a new name of 1 to 64 letters, digits, _ or -, "
                            f"got {_show(name)}", where)
    return name


@dataclass
class ResponseFormat:
    """`response_format`: "json_object" (any JSON object) or "json_schema" (`schema`)."""

    type: str
    schema: dict[str, Any] | None = None
    name: str | None = None
    # where the request gave it, for the `param` of its errors: chat completions' names by default;
    # the Responses API's `text.format`, the Messages API's `output_config.format`
    field: str = "response_format"
    schema_field: str = "response_format.json_schema.schema"


@dataclass
class GenerationRequest:
    """What /v1/completions and /v1/chat/completions share."""

    model: str
    max_tokens: int | None = None  # None: the endpoint's default
    # temperature, top_p, top_k (an extension, vLLM's name), seed and top_logprobs (None: no
    # logprobs) as the engine takes them; choice i of n samples with seed + i
    sampling: SamplingOptions = SamplingOptions()
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    stop: list[str] = field(default_factory=list)
    response_format: ResponseFormat | None = None  # None: free text


@dataclass
class CompletionRequest(GenerationRequest):
    prompts: list[str | list[int]] = field(default_factory=list)


@dataclass
class ChatRequest(GenerationRequest):
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str = "auto"  # "auto", "none", "required", or the name of the function to call
    parallel_tool_calls: bool = True
    thinking: Thinking = field(default_factory=Thinking)  # reasoning_effort (serve/thinking.py)
    fit_context: bool = False  # max_tokens past the context is cut to it (Responses and Messages)


@dataclass
class EmbeddingRequest:
    model: str
    inputs: list[str | list[int]]
    encoding_format: str = "float"  # or "base64": little-endian float32
    dimensions: int | None = None  # None: the model's width
    pooling: str = "mean"  # an extension: "mean" or "last"


@dataclass
class TranslationRequest:
    model: str
    inputs: list[str]
    beam_size: int | None = None  # None: the run's own (its config's decode.beam)


COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
          "seed", "user", "presence_penalty", "frequency_penalty", "logit_bias", "response_format"}


def _common(f: Fields, request: GenerationRequest, top_logprobs: int | None) -> None:
    request.model = f.string("model", required=True)
    request.max_tokens = f.integer("max_tokens", 1)
    request.sampling = read_sampling(f, top_logprobs=top_logprobs, seed_below=2 ** 63 - MAX_N)
    request.n = f.integer("n", 1, MAX_N, default=1)
    request.stream = f.boolean("stream")
    options = f.body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(
                options.get("include_usage", False), bool):
            raise f.fail("stream_options", 'an object like {"include_usage": true}')
        request.include_usage = request.stream and options.get("include_usage", False)
    request.stop = _stop(f)
    f.string("user")
    for name in ("presence_penalty", "frequency_penalty"):
        f.number(name, 0.0, lambda v: True, "a number")
        f.unsupported(name, lambda v: v == 0)
    f.unsupported("logit_bias", lambda v: v == {})
    request.response_format = _response_format(f)


def _response_format(f: Fields) -> ResponseFormat | None:
    """OpenAI's three forms; the schema itself is checked when it is compiled (its errors name
    JSON pointers inside response_format.json_schema.schema)."""
    value = f.body.get("response_format")
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return ResponseFormat("json_object")
    if kind == "json_schema" and set(value) == {"type", "json_schema"}:
        spec = value["json_schema"]
        where = "response_format.json_schema"
        if not isinstance(spec, dict) or set(spec) - {"name", "schema", "strict", "description"}:
            raise APIError(400, f'{where} must be an object {{"name", "schema", "strict", "description"}}, '
                           f"got {_show(spec)}", where)
        name = spec.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise APIError(400, f"{where}.name must be a name of 1 to 64 letters, digits, _ or -, got "
                           f"{_show(name)}", f"{where}.name")
        if not isinstance(spec.get("schema"), dict):
            raise APIError(400, f"{where}.schema must be a JSON schema (an object), got "
                           f"{_show(spec.get('schema'))}", f"{where}.schema")
        for key in ("strict",):
            if key in spec and not isinstance(spec[key], (bool, type(None))):
                raise APIError(400, f"{where}.{key} must be true or false", f"{where}.{key}")
        if "description" in spec and not isinstance(spec["description"], str):
            raise APIError(400, f"{where}.description must be a string", f"{where}.description")
        return ResponseFormat("json_schema", spec["schema"], name)
    raise f.fail("response_format", '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                 '"json_schema": {"name": ..., "schema": {...}}}')


def _stop(f: Fields) -> list[str]:
    value = f.body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not 1 <= len(stops) <= MAX_STOP or not all(
            isinstance(s, str) and s for s in stops):
        raise f.fail("stop", f"a non-empty string or a list of 1 to {MAX_STOP} non-empty strings")
    return stops


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    f = Fields(body, COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}, ignored=SDK_FIELDS)
    request = CompletionRequest(model="")
    _common(f, request, f.integer("logprobs", 0, MAX_TOP_LOGPROBS))
    request.prompts = _prompts(f)
    f.unsupported("echo", lambda v: v is False)
    f.unsupported("suffix", lambda v: v == "")
    f.unsupported("best_of", lambda v: v == request.n)
    if request.max_tokens is None:
        request.max_tokens = 16  # OpenAI's default for completions
    return request


def _prompts(f: Fields) -> list[str | list[int]]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    value = f.body.get("prompt")
    wanted = "a string, a list of strings, a list of token ids or a list of lists of token ids"

    def token_list(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool)
                                                      for t in v)
    if isinstance(value, str):
        return [value]
    if token_list(value):
        return [value]
    if isinstance(value, list) and value and len(value) <= MAX_INPUTS and all(
            isinstance(p, str) or token_list(p) for p in value):
        return list(value)
    if isinstance(value, list) and len(value) > MAX_INPUTS:
        raise APIError(400, f"prompt holds {len(value)} prompts; send at most {MAX_INPUTS} a request",
                       "prompt")
    raise f.fail("prompt", wanted)


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    f = Fields(body, COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens",
                               "response_format", "tools", "tool_choice", "parallel_tool_calls",
                               "reasoning_effort"},
               ignored=SDK_FIELDS)
    logprobs = f.boolean("logprobs")
    top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    request = ChatRequest(model="")
    _common(f, request, (top or 0) if logprobs else None)
    request.max_tokens = f.integer("max_completion_tokens", 1, default=request.max_tokens)
    request.messages = _messages(f)
    request.tools = _tools(f)
    request.tool_choice = _tool_choice(f, request.tools)
    request.parallel_tool_calls = f.boolean("parallel_tool_calls", default=True)
    effort = f.body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise f.fail("reasoning_effort", " or ".join(f'"{e}"' for e in EFFORTS))
    request.thinking = effort_thinking(effort)
    return request


def _tools(f: Fields) -> list[Tool]:
    """OpenAI's function tools: each {"type": "function", "function": {"name", "description",
    "parameters", "strict"}}; names unique; every tool with a parameters schema."""
    value = f.body.get("tools")
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise f.fail("tools", f"a list of at most {MAX_TOOLS} tools")
    tools: list[Tool] = []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) != {"type", "function"} \
                or not isinstance(tool["function"], dict):
            raise APIError(400, f'{where} must be {{"type": "function", "function": {{"name", "parameters", '
                           f'...}}}}, got {_show(tool)}', where)
        function = tool["function"]
        extra = sorted(set(function) - {"name", "description", "parameters", "strict"})
        if extra:
            raise APIError(400, f"{where}.function has unknown field(s) {', '.join(extra)}",
                           f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise APIError(400, f"{where}.function.name must be a name of 1 to 64 letters, digits, _ or -, "
                           f"got {_show(name)}", f"{where}.function.name")
        if any(t.name == name for t in tools):
            raise APIError(400, f"tools holds two functions named {name!r}; give each tool its own name",
                           f"{where}.function.name")
        if not isinstance(function.get("parameters"), dict):
            raise APIError(400, f"{where}.function.parameters must be the JSON schema of the function's "
                           f'arguments (an object, e.g. {{"type": "object", "properties": {{}}}}), got '
                           f"{_show(function.get('parameters'))}", f"{where}.function.parameters")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise APIError(400, f"{where}.function.description must be a string",
                           f"{where}.function.description")
        if not isinstance(function.get("strict", False), (bool, type(None))):
            raise APIError(400, f"{where}.function.strict must be true or false", f"{where}.function.strict")
        tools.append(Tool(name, description, function["parameters"]))
    return tools


def _tool_choice(f: Fields, tools: list[Tool]) -> str:
    value = f.body.get("tool_choice")
    if value is None:
        return "auto" if tools else "none"
    if value in ("auto", "none", "required"):
        choice = value
    elif isinstance(value, dict) and set(value) == {"type", "function"} and value["type"] == "function" \
            and isinstance(value["function"], dict) and isinstance(value["function"].get("name"), str):
        choice = value["function"]["name"]
        if choice not in {t.name for t in tools}:
            raise APIError(400, f"tool_choice names the function {choice!r}, which is not among tools "
                           f"({', '.join(t.name for t in tools) or 'none given'})", "tool_choice")
    else:
        raise f.fail("tool_choice",
                     '"auto", "none", "required" or {"type": "function", "function": {"name": ...}}')
    if not tools and choice != "none":
        raise APIError(400, f"tool_choice {_show(value)} needs tools; give tools or leave tool_choice out",
                       "tool_choice")
    return choice


ROLES = ("system", "developer", "user", "assistant", "tool")  # developer: OpenAI's newer name for system


def _messages(f: Fields) -> list[dict[str, Any]]:
    """Each message as the chat template sees it: role (`developer` becomes `system`, as OpenAI
    maps it) and content (text parts joined), plus an assistant's tool_calls (their arguments
    parsed into objects, as templates take them) and a tool message's tool_call_id and name. Only
    an assistant message with tool calls may leave its content out."""
    value = f.body.get("messages")
    if not isinstance(value, list) or not value:
        raise APIError(400, 'messages must be a non-empty list of {"role": ..., "content": ...} objects, got '
                       f"{_show(value)}", "messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(400, f'{where} must be an object {{"role": ..., "content": ...}}, got '
                           f"{_show(message)}", where)
        if message.get("role") not in ROLES:
            raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}, got "
                           f"{_show(message.get('role'))}", f"{where}.role")
        content = _content(message.get("content"), f"{where}.content")
        extra = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls")}
        if not all(isinstance(v, (str, type(None))) for v in extra.values()):
            raise APIError(400, f"{where} may hold only text fields besides role, content and tool_calls, "
                           f"got {_show(message)}", where)
        parsed = {**extra, "role": "system" if message["role"] == "developer" else message["role"],
                  "content": content if content is not None else ""}
        if message.get("tool_calls") is not None:
            if parsed["role"] != "assistant":
                raise APIError(400, f"{where}.tool_calls: only an assistant message holds tool calls",
                               f"{where}.tool_calls")
            parsed["tool_calls"] = _tool_calls(message["tool_calls"], f"{where}.tool_calls")
        elif content is None:
            raise APIError(400, f"{where}.content is required: a {message['role']} message needs its text "
                           "(only an assistant message with tool_calls may leave it out)", f"{where}.content")
        out.append(parsed)
    if (unmatched := unmatched_tool_result(out)) is not None:
        i, given, called = unmatched
        earlier = f"the earlier calls are {', '.join(map(repr, called))}" if called \
            else "no earlier assistant message has tool_calls"
        raise APIError(400, f"messages[{i}].tool_call_id {given!r} matches no tool call: {earlier}; send "
                       "the assistant message that made the call before its result, with the same id",
                       f"messages[{i}].tool_call_id")
    return out


def unmatched_tool_result(messages: list[dict[str, Any]]) -> tuple[int, str, list[str]] | None:
    """The first tool message whose tool_call_id names no call of an earlier assistant message: its
    index, the id and the ids that were called; None when every result answers a call. OpenAI and
    Anthropic refuse such a result: a template would render an answer to nothing."""
    called: list[str] = []
    for i, message in enumerate(messages):
        called += [call["id"] for call in message.get("tool_calls", ())]
        given = message.get("tool_call_id")
        if message["role"] == "tool" and given is not None and given not in called:
            return i, given, called
    return None


def _content(content: Any, where: str) -> str | None:
    """A message's text: a string, or text content parts joined; None when it is missing."""
    if isinstance(content, list):  # content parts: only text can be shown to this model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise APIError(400, f'{where} parts must all be {{"type": "text", "text": ...}}; '
                           "this model reads text only", where)
        return "".join(p["text"] for p in content)
    if content is not None and not isinstance(content, str):
        raise APIError(400, f"{where} must be a string, got {_show(content)}", where)
    return content


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """An assistant message's tool calls, OpenAI's form, with `arguments` (a JSON string) parsed."""
    if not isinstance(value, list) or not value:
        raise APIError(400, f"{where} must be a non-empty list of tool calls", where)
    calls = []
    for j, call in enumerate(value):
        at = f"{where}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function" \
                or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments"), str) \
                or not isinstance(call.get("id", ""), str):
            raise APIError(400, f'{at} must be {{"id": ..., "type": "function", "function": {{"name": ..., '
                           f'"arguments": "<JSON text>"}}}}, got {_show(call)}', at)
        try:
            arguments = json.loads(function["arguments"])
        except (ValueError, RecursionError):
            arguments = None
        if not isinstance(arguments, dict):
            raise APIError(400, f"{at}.function.arguments must be a JSON object written as a string, got "
                           f"{_show(function['arguments'])}", f"{at}.function.arguments")
        calls.append({"id": call.get("id", ""), "type": "function",
                      "function": {"name": function["name"], "arguments": arguments}})
    return calls


def parse_embeddings(body: dict[str, Any]) -> EmbeddingRequest:
    f = Fields(body, {"model", "input", "encoding_format", "dimensions", "user", "pooling"},
               ignored=SDK_FIELDS)
    model = f.string("model", required=True)
    value = f.body.get("input")
    wanted = "a non-empty string, a list of them, a list of token ids or a list of lists of token ids"

    def token_list(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in v)

    if isinstance(value, str) or token_list(value):
        inputs = [value]
    elif isinstance(value, list) and value and all((isinstance(v, str)) or token_list(v) for v in value):
        inputs = list(value)
    elif isinstance(value, list) and not value:
        raise APIError(400, "input is an empty list; give at least one text", "input")
    else:
        raise f.fail("input", wanted)
    if len(inputs) > MAX_EMBED_INPUTS:
        raise APIError(400, f"input holds {len(inputs)} items; send at most {MAX_EMBED_INPUTS} a request",
                       "input")
    if any(isinstance(v, str) and not v for v in inputs):
        raise APIError(400, "input holds an empty string; every text must have at least one character",
                       "input")
    encoding = f.body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise f.fail("encoding_format", '"float" or "base64"')
    pooling = f.body.get("pooling", "mean")
    if pooling not in ("mean", "last"):
        raise f.fail("pooling", '"mean" or "last"')
    f.string("user")
    return EmbeddingRequest(model, inputs, encoding, f.integer("dimensions", 1), pooling)


def parse_translation(body: dict[str, Any]) -> TranslationRequest:
    f = Fields(body, {"model", "input", "beam_size", "user"})
    model = f.string("model", required=True)
    value = f.body.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not 1 <= len(inputs) <= MAX_INPUTS or not all(
            isinstance(t, str) and t.strip() for t in inputs):
        raise f.fail("input", f"a non-empty string or a list of 1 to {MAX_INPUTS} non-empty strings")
    f.string("user")
    return TranslationRequest(model, inputs, f.integer("beam_size", 1, MAX_BEAM))


__all__ = ["ChatRequest", "CompletionRequest", "EmbeddingRequest", "GenerationRequest", "ResponseFormat",
           "TranslationRequest", "parse_chat", "parse_completion", "parse_embeddings", "parse_translation",
           "unmatched_tool_result"]

"""The request bodies of the OpenAI-compatible routes, read into typed dataclasses.

Every field is checked by hand so that each error names the field (`param`) and says what to send
instead, as OpenAI's do. Options the server cannot honour are refused rather than ignored when
they would change the answer (a non-zero penalty, logit_bias, tools, echo); options that change
nothing here (`user`, a zero penalty, `stream_options` without streaming...) are accepted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from handformer.serve.errors import APIError

MAX_N = 64  # choices per prompt
MAX_STOP = 16  # stop strings
MAX_TOP_LOGPROBS = 20
MAX_INPUTS = 64  # prompts per completion request, texts per translation request
MAX_BEAM = 16


@dataclass
class GenerationRequest:
    """What /v1/completions and /v1/chat/completions share."""

    model: str
    max_tokens: int | None = None  # None: the endpoint's default
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None  # an extension (vLLM's name)
    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int | None = None  # None: no logprobs


@dataclass
class CompletionRequest(GenerationRequest):
    prompts: list[str | list[int]] = field(default_factory=list)


@dataclass
class ChatRequest(GenerationRequest):
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TranslationRequest:
    model: str
    inputs: list[str]
    beam_size: int | None = None  # None: the run's own (its config's decode.beam)


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; NaN and Infinity are refused (they are not JSON)."""
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        data = json.loads(body.decode("utf-8"), parse_constant=no_constants)
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text; send JSON", code="invalid_json") from None
    except ValueError as err:
        raise APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}",
                       code="invalid_json")
    return data


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Typed reads of a request body's fields; each error names the field."""

    def __init__(self, body: dict[str, Any], known: set[str]) -> None:
        unknown = sorted(set(body) - known)
        if unknown:
            raise APIError(400, f"unrecognized request argument(s): {', '.join(unknown)}; this endpoint "
                           f"takes {', '.join(sorted(known))}", unknown[0])
        self.body = body

    def fail(self, name: str, wanted: str) -> APIError:
        return APIError(400, f"{name} must be {wanted}, got {_show(self.body.get(name))}", name)

    def string(self, name: str, required: bool = False) -> str | None:
        value = self.body.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(name, "a non-empty string")
        return value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(name, "true or false")
        return value

    def integer(self, name: str, low: int, high: int | None = None, default: int | None = None) -> int | None:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None
                                                                                    and value > high):
            bound = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
            raise self.fail(name, bound)
        return value

    def number(self, name: str, default: float, ok: Any, wanted: str) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not ok(value):
            raise self.fail(name, wanted)
        return float(value)

    def unsupported(self, name: str, harmless: Any) -> None:
        """Accept `name` only when it changes nothing (`harmless(value)`)."""
        value = self.body.get(name)
        if value is not None and not harmless(value):
            raise APIError(400, f"{name}={_show(value)} is not supported by this server; leave it out",
                           name)


COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop",
          "seed", "user", "presence_penalty", "frequency_penalty", "logit_bias"}


def _common(f: Fields, request: GenerationRequest) -> None:
    request.model = f.string("model", required=True)
    request.max_tokens = f.integer("max_tokens", 1)
    request.temperature = f.number("temperature", 1.0, lambda v: v >= 0, "a number >= 0 (0 = greedy)")
    top_p = f.number("top_p", 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
    request.top_p = None if top_p == 1 else top_p
    request.top_k = f.integer("top_k", 1)
    request.n = f.integer("n", 1, MAX_N, default=1)
    request.stream = f.boolean("stream")
    options = f.body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(
                options.get("include_usage", False), bool):
            raise f.fail("stream_options", 'an object like {"include_usage": true}')
        request.include_usage = request.stream and options.get("include_usage", False)
    request.stop = _stop(f)
    request.seed = f.integer("seed", -(2 ** 63))
    if request.seed is not None and request.seed >= 2 ** 63 - MAX_N:
        raise f.fail("seed", f"an integer below {2 ** 63 - MAX_N}")
    f.string("user")
    for name in ("presence_penalty", "frequency_penalty"):
        f.number(name, 0.0, lambda v: True, "a number")
        f.unsupported(name, lambda v: v == 0)
    f.unsupported("logit_bias", lambda v: v == {})


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
    f = Fields(body, COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"})
    request = CompletionRequest(model="")
    _common(f, request)
    request.prompts = _prompts(f)
    request.top_logprobs = f.integer("logprobs", 0, MAX_TOP_LOGPROBS)
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
                               "response_format", "tools", "tool_choice", "parallel_tool_calls"})
    request = ChatRequest(model="")
    _common(f, request)
    request.max_tokens = f.integer("max_completion_tokens", 1, default=request.max_tokens)
    request.messages = _messages(f)
    logprobs = f.boolean("logprobs")
    top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    request.top_logprobs = (top or 0) if logprobs else None
    f.unsupported("response_format", lambda v: v == {"type": "text"})
    f.unsupported("tools", lambda v: v == [])
    f.unsupported("tool_choice", lambda v: v == "none")
    f.unsupported("parallel_tool_calls", lambda v: isinstance(v, bool))
    return request


def _messages(f: Fields) -> list[dict[str, Any]]:
    value = f.body.get("messages")
    if not isinstance(value, list) or not value:
        raise APIError(400, 'messages must be a non-empty list of {"role": ..., "content": ...} objects, got '
                       f"{_show(value)}", "messages")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not message["role"]:
            raise APIError(400, f'{where} must be an object with a "role" string, got {_show(message)}',
                           where)
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text can be shown to this model
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise APIError(400, f'{where}.content parts must all be {{"type": "text", "text": ...}}; '
                               "this model reads text only", f"{where}.content")
            content = "".join(p["text"] for p in content)
        elif content is not None and not isinstance(content, str):
            raise APIError(400, f"{where}.content must be a string, got {_show(content)}", f"{where}.content")
        extra = {k: v for k, v in message.items() if k not in ("role", "content")}
        if not all(isinstance(v, (str, type(None))) for v in extra.values()):
            raise APIError(400, f"{where} may hold only text fields besides role and content "
                           f"(tool calls are not supported), got {_show(message)}", where)
        out.append({**extra, "role": message["role"], "content": content if content is not None else ""})
    return out


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


__all__ = ["ChatRequest", "CompletionRequest", "GenerationRequest", "TranslationRequest", "parse_chat",
           "parse_completion", "parse_json", "parse_translation"]

"""Every /v1 route's request body written out as a JSON schema (Draft 2020-12): what
openai_schema.py accepts, field by field. tests/test_serve_fuzz.py holds the two equal: a body the
schema refuses is a 400, and a body drawn from the schema (with a served model, a prompt that fits
the context and token ids in the vocabulary: what no schema can know) is answered.

An "integer" is a JSON integer (1.0 is a number, not an integer, for these routes); `null` means
"not given" for every optional field. Checks across fields that a schema cannot say are the
route's: a tool name given twice, `best_of` equal to `n`, arguments that parse as a JSON object.
"""

from __future__ import annotations

from typing import Any

from handformer.serve.door import SDK_FIELDS
from handformer.serve.openai_schema import (
    MAX_BEAM,
    MAX_EMBED_INPUTS,
    MAX_INPUTS,
    MAX_N,
    MAX_STOP,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    ROLES,
)


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, schema]}


def integer(low: int, high: int | None = None) -> dict[str, Any]:
    return {"type": "integer", "minimum": low} | ({"maximum": high} if high is not None else {})


TEXT = {"type": "string", "minLength": 1}
NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
TOKENS = {"type": "array", "minItems": 1, "items": {"type": "integer"}}
NO_CHANGE = {"const": 0}  # a penalty of 0: accepted, changes nothing

RESPONSE_FORMAT = nullable({"oneOf": [
    {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"],
     "additionalProperties": False},
    {"type": "object", "required": ["type", "json_schema"], "additionalProperties": False, "properties": {
        "type": {"const": "json_schema"},
        "json_schema": {"type": "object", "required": ["name", "schema"], "additionalProperties": False,
                        "properties": {"name": NAME, "schema": {"type": "object"},
                                       "strict": nullable({"type": "boolean"}),
                                       "description": {"type": "string"}}}}}]})

COMMON: dict[str, Any] = {
    "model": TEXT,
    "max_tokens": nullable(integer(1)),
    "temperature": nullable({"type": "number", "minimum": 0}),
    "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
    "top_k": nullable(integer(1)),
    "n": nullable(integer(1, MAX_N)),
    "stream": nullable({"type": "boolean"}),
    "stream_options": nullable({"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                                "additionalProperties": False}),
    "stop": nullable({"anyOf": [TEXT, {"type": "array", "minItems": 1, "maxItems": MAX_STOP,
                                       "items": TEXT}]}),
    "seed": nullable(integer(-(2 ** 63), 2 ** 63 - MAX_N - 1)),
    "user": nullable(TEXT),
    "presence_penalty": nullable(NO_CHANGE),
    "frequency_penalty": nullable(NO_CHANGE),
    "logit_bias": nullable({"type": "object", "maxProperties": 0}),
    "response_format": RESPONSE_FORMAT,
} | {name: True for name in sorted(SDK_FIELDS)}  # accepted whatever they hold, never read

COMPLETIONS = {
    "type": "object", "required": ["model", "prompt"], "additionalProperties": False,
    "properties": COMMON | {
        "prompt": {"anyOf": [{"type": "string"}, TOKENS,
                             {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                              "items": {"anyOf": [{"type": "string"}, TOKENS]}}]},
        "logprobs": nullable(integer(0, MAX_TOP_LOGPROBS)),
        "echo": nullable({"const": False}),
        "suffix": nullable({"const": ""}),
        "best_of": nullable(integer(1, MAX_N)),  # equal to n
    }}

MESSAGE = {
    "type": "object", "required": ["role"],
    "properties": {
        "role": {"enum": list(ROLES)},
        "content": {"anyOf": [{"type": "null"}, {"type": "string"}, {"type": "array", "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}}]},
        "tool_calls": nullable({"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["function"],
            "properties": {"id": {"type": "string"}, "type": {"const": "function"},
                           "function": {"type": "object", "required": ["name", "arguments"],
                                        "properties": {"name": {"type": "string"},
                                                       "arguments": {"type": "string"}}}}}}),  # a JSON object
    },
    "additionalProperties": {"type": ["string", "null"]},  # name, tool_call_id, ...
    "if": {"required": ["tool_calls"], "properties": {"tool_calls": {"type": "array"}}},
    "then": {"properties": {"role": {"const": "assistant"}}},
    # without tool calls, a message needs its content
    "else": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
}

TOOL = {"type": "object", "required": ["type", "function"], "additionalProperties": False, "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "parameters"], "additionalProperties": False,
                 "properties": {"name": NAME, "description": nullable({"type": "string"}),
                                "parameters": {"type": "object"},  # a JSON schema, checked when compiled
                                "strict": nullable({"type": "boolean"})}}}}

CHAT = {
    "type": "object", "required": ["model", "messages"], "additionalProperties": False,
    "properties": COMMON | {
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        "logprobs": nullable({"type": "boolean"}),
        "top_logprobs": nullable(integer(0, MAX_TOP_LOGPROBS)),  # needs logprobs: true
        "max_completion_tokens": nullable(integer(1)),
        "tools": nullable({"type": "array", "maxItems": MAX_TOOLS, "items": TOOL}),  # names unique
        "tool_choice": nullable({"anyOf": [
            {"enum": ["auto", "none", "required"]},  # a choice other than "none" needs tools
            {"type": "object", "required": ["type", "function"], "additionalProperties": False,
             "properties": {"type": {"const": "function"},
                            "function": {"type": "object", "required": ["name"],
                                         "properties": {"name": {"type": "string"}}}}}]}),  # among tools
        "parallel_tool_calls": nullable({"type": "boolean"}),
    },
    "if": {"required": ["top_logprobs"], "properties": {"top_logprobs": {"type": "integer"}}},
    "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
}

EMBEDDINGS = {
    "type": "object", "required": ["model", "input"], "additionalProperties": False,
    "properties": {
        "model": TEXT,
        "input": {"anyOf": [TEXT, TOKENS, {"type": "array", "minItems": 1, "maxItems": MAX_EMBED_INPUTS,
                                            "items": {"anyOf": [TEXT, TOKENS]}}]},
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": nullable(integer(1)),  # at most the model's width
        "pooling": {"enum": ["mean", "last"]},
        "user": nullable(TEXT),
    } | {name: True for name in sorted(SDK_FIELDS)}}

TRANSLATIONS = {
    "type": "object", "required": ["model", "input"], "additionalProperties": False,
    "properties": {
        "model": TEXT,
        "input": {"anyOf": [{"type": "string", "pattern": "\\S"},
                            {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                             "items": {"type": "string", "pattern": "\\S"}}]},
        "beam_size": nullable(integer(1, MAX_BEAM)),
        "user": nullable(TEXT),
    }}

REQUEST_SCHEMAS = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT, "/v1/embeddings": EMBEDDINGS,
                   "/v1/translations": TRANSLATIONS}

__all__ = ["CHAT", "COMPLETIONS", "EMBEDDINGS", "REQUEST_SCHEMAS", "TRANSLATIONS"]

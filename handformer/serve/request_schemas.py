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
from handformer.serve.thinking import EFFORT_BUDGETS, EFFORTS


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
        "reasoning_effort": nullable({"enum": list(EFFORTS)}),
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

ANY: dict[str, Any] = {}  # any JSON value: a field accepted and ignored
NULL = {"type": "null"}  # a block's empty field, as a client sends back what it read
TEXT_PART = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"enum": ["input_text", "output_text", "text"]},
                            "text": {"type": "string"}}}
REFUSAL_PART = {"type": "object", "required": ["type", "refusal"],
                "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}}}
PARTS = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [TEXT_PART, REFUSAL_PART]}}]}
INPUT_ITEM = {"anyOf": [  # other fields (id, status) are accepted and ignored
    {"type": "object", "required": ["role", "content"],
     "properties": {"type": {"const": "message"}, "role": {"enum": ["user", "assistant", "system",
                                                                    "developer"]},
                    "content": PARTS}},
    {"type": "object", "required": ["type", "call_id", "name", "arguments"],
     "properties": {"type": {"const": "function_call"}, "call_id": TEXT, "name": TEXT,
                    "arguments": TEXT}},  # a JSON object
    {"type": "object", "required": ["type", "call_id", "output"],
     "properties": {"type": {"const": "function_call_output"}, "call_id": TEXT, "output": PARTS}}]}
FUNCTION = {"type": "object", "required": ["type", "name"], "additionalProperties": False, "properties": {
    "type": {"const": "function"}, "name": NAME, "description": nullable({"type": "string"}),
    "parameters": nullable({"type": "object"}), "strict": nullable({"type": "boolean"})}}  # names unique

RESPONSES = {
    "type": "object", "required": ["model", "input"], "additionalProperties": False,
    "properties": {
        "model": TEXT,
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": INPUT_ITEM}]},
        "instructions": nullable(TEXT),
        "tools": nullable({"type": "array", "items": FUNCTION}),
        "tool_choice": nullable({"anyOf": [  # a function among tools
            {"enum": ["auto", "none", "required"]},
            {"type": "object", "required": ["type", "name"], "additionalProperties": False,
             "properties": {"type": {"const": "function"}, "name": {"type": "string"}}}]}),
        "text": nullable({"type": "object", "additionalProperties": False, "properties": {
            "verbosity": ANY,
            "format": nullable({"oneOf": [
                {"type": "object", "required": ["type"], "additionalProperties": False,
                 "properties": {"type": {"enum": ["text", "json_object"]}}},
                {"type": "object", "required": ["type", "name", "schema"], "additionalProperties": False,
                 "properties": {"type": {"const": "json_schema"}, "name": NAME, "schema": {"type": "object"},
                                "strict": nullable({"type": "boolean"}),
                                "description": nullable({"type": "string"})}}]})}}),
        "max_output_tokens": nullable(integer(1)),
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "stream": nullable({"type": "boolean"}),
        "store": nullable({"type": "boolean"}),
        "previous_response_id": nullable(TEXT),  # a stored response's (else a 404)
        "reasoning": nullable({"type": "object", "additionalProperties": False, "properties": {
            "effort": nullable({"enum": list(EFFORTS)}), "summary": ANY, "generate_summary": ANY}}),
        "parallel_tool_calls": nullable({"type": "boolean"}),
        "metadata": nullable({"type": "object"}),
        "include": nullable({"type": "array"}),
        "stream_options": nullable({"type": "object"}),
        "top_logprobs": nullable(integer(0, 0)),
        "background": nullable({"const": False}),
        **{name: nullable({"type": "string"}) for name in ("truncation", "service_tier", "user",
                                                           "prompt_cache_key",
                                                          "safety_identifier")},
    }}

TEXT_BLOCK = {"type": "object", "required": ["type", "text"],  # other fields (citations...) ignored
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
TOOL_USE = {"type": "object", "required": ["type", "id", "name", "input"], "additionalProperties": NULL,
            "properties": {"type": {"const": "tool_use"}, "id": {"type": "string"},
                           "name": {"type": "string"},
                           "input": {"type": "object"}, "cache_control": ANY}}
TOOL_RESULT = {"type": "object", "required": ["type", "tool_use_id"], "additionalProperties": NULL,
               "properties": {"type": {"const": "tool_result"}, "tool_use_id": {"type": "string"},
                              "content": {"anyOf": [{"type": "string"}, NULL,
                                                    {"type": "array", "items": TEXT_BLOCK}]},
                              "is_error": nullable({"type": "boolean"}), "cache_control": ANY}}
THINKING_BLOCK = {"type": "object", "required": ["type"],  # an earlier turn's: dropped
                  "properties": {"type": {"enum": ["thinking", "redacted_thinking"]}}}


def turn(role: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "object", "required": ["role", "content"], "additionalProperties": False, "properties": {
        "role": {"const": role},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": blocks}}]}}}


TOOL_CHOICE = {"oneOf": [  # "tool" names one of tools; every choice but "none" needs tools
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"enum": ["auto", "any", "none"]},
                    "disable_parallel_tool_use": {"type": "boolean"}}},
    {"type": "object", "required": ["type", "name"], "additionalProperties": False,
     "properties": {"type": {"const": "tool"}, "name": {"type": "string"},
                    "disable_parallel_tool_use": {"type": "boolean"}}}]}
THINKING = {"oneOf": [  # budget_tokens below max_tokens
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"const": "disabled"}}},
    {"type": "object", "required": ["type"], "additionalProperties": False,
     "properties": {"type": {"const": "adaptive"}, "display": ANY}},
    {"type": "object", "required": ["type", "budget_tokens"], "additionalProperties": False,
     "properties": {"type": {"const": "enabled"}, "budget_tokens": integer(1), "display": ANY}}]}
PROMPT = {
    "model": TEXT,
    "messages": {"type": "array", "minItems": 1, "items": {"anyOf": [
        turn("user", [TEXT_BLOCK, TOOL_RESULT]), turn("assistant", [TEXT_BLOCK, TOOL_USE, THINKING_BLOCK])]}},
    "system": nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_BLOCK}]}),
    "tools": nullable({"type": "array", "items": {  # names unique
        "type": "object", "required": ["name", "input_schema"], "additionalProperties": False,
        "properties": {"type": {"const": "custom"}, "name": NAME, "description": nullable({"type": "string"}),
                       "input_schema": {"type": "object"}, "cache_control": ANY}}}),
    "tool_choice": nullable(TOOL_CHOICE),
    "thinking": nullable(THINKING),
    "output_config": nullable({"type": "object", "additionalProperties": False, "properties": {
        "effort": nullable({"enum": [*EFFORT_BUDGETS, "max"]}),
        "format": nullable({"type": "object", "required": ["type", "schema"], "additionalProperties": False,
                            "properties": {"type": {"const": "json_schema"},
                                           "schema": {"type": "object"}}})}}),
}
MESSAGES = {
    "type": "object", "required": ["model", "messages", "max_tokens"], "additionalProperties": False,
    "properties": PROMPT | {
        "max_tokens": integer(1),
        "stop_sequences": nullable({"type": "array", "maxItems": MAX_STOP, "items": TEXT}),
        "stream": nullable({"type": "boolean"}),
        "temperature": nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "top_p": nullable({"type": "number", "exclusiveMinimum": 0, "maximum": 1}),
        "top_k": nullable(integer(1)),
        "metadata": nullable({"type": "object"}),
        "cache_control": nullable({"type": "object"}),
        **{name: nullable({"type": "string"}) for name in ("service_tier", "inference_geo", "speed")},
    }}
COUNT_TOKENS = {"type": "object", "required": ["model", "messages"], "additionalProperties": False,
                "properties": PROMPT}

REQUEST_SCHEMAS = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT, "/v1/embeddings": EMBEDDINGS,
                   "/v1/translations": TRANSLATIONS, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES,
                   "/v1/messages/count_tokens": COUNT_TOKENS}

__all__ = ["CHAT", "COMPLETIONS", "COUNT_TOKENS", "EMBEDDINGS", "MESSAGES", "REQUEST_SCHEMAS", "RESPONSES",
           "TRANSLATIONS"]

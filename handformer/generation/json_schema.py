"""JSON schemas as structured output takes them (OpenAI's `response_format`, a tool's
`parameters`): checked before a grammar is built from one, so that each error names the place in
the schema (a JSON pointer, RFC 6901) and what is wrong there.

Three kinds of refusal:
- the schema is not a valid JSON Schema (a keyword of the wrong type, `required` not a list of
  strings, a negative `maxLength`, ...): `SchemaError` with the pointer;
- it uses keywords the grammar engine cannot enforce token by token (`not`, `if`/`then`/`else`,
  `uniqueItems`, `contains`, `propertyNames`, `dependentRequired`, ...): `SchemaError` naming every
  such keyword with its pointer (a keyword left unenforced would give replies that do not
  validate);
- it is too large (bytes, nesting, subschemas): `SchemaError` with the limit.
Annotations (`title`, `description`, `default`, `examples`, ...) and keywords JSON Schema does not
define are ignored, as JSON Schema says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from handformer.settings import is_int, is_number

MAX_SCHEMA_BYTES = 64 * 1024  # as JSON text
MAX_SCHEMA_DEPTH = 32  # subschemas inside subschemas
MAX_SUBSCHEMAS = 2000

TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")
UNSUPPORTED = ("not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
               "uniqueItems", "contains", "minContains", "maxContains", "propertyNames",
               "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$dynamicAnchor",
               "$recursiveRef", "$recursiveAnchor", "additionalItems", "contentSchema")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")  # name -> subschema
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")  # non-empty lists of subschemas
SUBSCHEMAS = ("additionalProperties", "items")  # one subschema
NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
STRINGS = ("pattern", "format", "$ref", "$schema", "$id", "$anchor", "$comment", "title", "description")


class SchemaError(ValueError):
    """A schema refused: `pointer` is where (RFC 6901, "" for the whole schema)."""

    def __init__(self, message: str, pointer: str = "", unsupported: list[str] | None = None) -> None:
        super().__init__(message)
        self.message, self.pointer, self.unsupported = message, pointer, unsupported or []


def pointer_part(key: str | int) -> str:
    """One step of a JSON pointer ("~" and "/" escaped as RFC 6901 says)."""
    return "/" + str(key).replace("~", "~0").replace("/", "~1")


def check_schema(schema: Any, where: str = "the schema") -> None:
    """Raise `SchemaError` if `schema` is not a JSON Schema that structured output can enforce."""
    try:
        size = len(json.dumps(schema, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        raise SchemaError(f"{where} must be JSON data (an object)") from None
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError(f"{where} is {size} bytes as JSON, over the limit of {MAX_SCHEMA_BYTES}; "
                          "send a smaller schema")
    if not isinstance(schema, dict):
        raise SchemaError(f"{where} must be a JSON object, got {type(schema).__name__}")
    count, unsupported = 0, []
    for pointer, sub, depth in subschemas(schema, "", 0):
        count += 1
        if count > MAX_SUBSCHEMAS:
            raise SchemaError(f"{where} has more than {MAX_SUBSCHEMAS} subschemas; send a smaller schema")
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(f"{where} nests subschemas more than {MAX_SCHEMA_DEPTH} deep", pointer)
        check_keywords(sub, pointer, where)
        if isinstance(sub, dict):
            unsupported += [pointer + pointer_part(k) for k in UNSUPPORTED if k in sub]
    if unsupported:
        names = sorted({p.rsplit("/", 1)[-1] for p in unsupported})
        raise SchemaError(f"{where} uses keyword(s) that structured output cannot enforce: "
                          f"{', '.join(names)} (at {', '.join(unsupported[:5])}"
                          f"{', ...' if len(unsupported) > 5 else ''}); leave them out",
                          unsupported[0], unsupported)


def subschemas(schema: Any, pointer: str, depth: int) -> Iterator[tuple[str, Any, int]]:
    """Every subschema with its pointer and depth, the schema itself first. A keyword of the
    wrong shape is reported by `check_keywords`, not walked into."""
    yield pointer, schema, depth
    if not isinstance(schema, dict):
        return
    for key in SCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, dict):
            for name, sub in value.items():
                yield from subschemas(sub, pointer + pointer_part(key) + pointer_part(name), depth + 1)
    for key in SCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            for i, sub in enumerate(value):
                yield from subschemas(sub, f"{pointer}{pointer_part(key)}/{i}", depth + 1)
    for key in SUBSCHEMAS:
        if isinstance(schema.get(key), (dict, bool)):
            yield from subschemas(schema[key], pointer + pointer_part(key), depth + 1)


def check_keywords(schema: Any, pointer: str, where: str) -> None:
    """The keywords of one subschema have the types JSON Schema gives them."""
    def fail(key: str | None, wanted: str) -> SchemaError:
        at = pointer + (pointer_part(key) if key is not None else "")
        return SchemaError(f"{where} is not a valid JSON Schema at {at or '/'}: {wanted}", at)

    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise fail(None, f"a schema must be an object or a boolean, got {json.dumps(schema)[:40]}")
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) and k in TYPES for k in kinds) \
                or len(set(kinds)) < len(kinds):
            raise fail("type", f"type must be one of {', '.join(TYPES)} or a list of them without repeats")
    for key in SCHEMA_MAPS:
        if key in schema and not isinstance(schema[key], dict):
            raise fail(key, f"{key} must be an object of schemas")
    for key in SCHEMA_LISTS:
        if key in schema and (not isinstance(schema[key], list) or not schema[key]):
            raise fail(key, f"{key} must be a non-empty list of schemas")
    for key in SUBSCHEMAS:
        if key in schema and not isinstance(schema[key], (dict, bool)):
            tuples = " (for a list of schemas, one per item, use prefixItems)" if key == "items" else ""
            raise fail(key, f"{key} must be a schema (an object or a boolean){tuples}")
    for key in NUMBERS:
        value = schema.get(key)
        if key in schema and (not is_number(value)
                              or not math.isfinite(value)):
            raise fail(key, f"{key} must be a number")
    multiple = schema.get("multipleOf")
    if "multipleOf" in schema and (not is_number(multiple)
                                   or not multiple > 0):
        raise fail("multipleOf", "multipleOf must be a number > 0")
    for key in COUNTS:
        value = schema.get(key)
        if key in schema and (not is_int(value) or value < 0):
            raise fail(key, f"{key} must be an integer >= 0")
    for key in STRINGS:
        if key in schema and not isinstance(schema[key], str):
            raise fail(key, f"{key} must be a string")
    required = schema.get("required")
    if "required" in schema and (not isinstance(required, list)
                                 or not all(isinstance(r, str) for r in required)
                                 or len(set(required)) < len(required)):
        raise fail("required", "required must be a list of property names without repeats")
    if "enum" in schema and (not isinstance(schema["enum"], list) or not schema["enum"]):
        raise fail("enum", "enum must be a non-empty list of values")


__all__ = ["MAX_SCHEMA_BYTES", "MAX_SCHEMA_DEPTH", "SchemaError", "UNSUPPORTED", "check_schema",
           "pointer_part"]

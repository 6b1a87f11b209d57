"""Request bodies for the fuzz test: drawn from a route's JSON schema (handformer/serve/
request_schemas.py), and mutated outside it. Seeded: the same seed draws the same bodies."""

from __future__ import annotations

import copy
import json
import random
import string
from typing import Any

import jsonschema

# A JSON integer is an int (1.0 is a float here, as the routes read it).
TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool))
Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=TYPES)

ODD_STRINGS = ["", " ", "\x00", "\ud800", "é中文🙂", "</s>", "<|im_end|>", "\n" * 50, "x" * 5000, "null",
               "{\"a\": 1}", "\u202e", "%s%n"]
ODD_VALUES = [None, True, False, 0, -1, 1.5, -1e300, 1e300, 10 ** 30, -(10 ** 30), 2 ** 63, "", "1", [], {},
              [[[]]], {"a": {"b": {}}}, "\ud800", 0.1, -0.0]


def deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return value


class Draw:
    """Values valid for a schema, with `caps` bounding named properties (few tokens, short text)
    and `choose` naming the values some properties must take (the served model ids...)."""

    def __init__(self, rng: random.Random, caps: dict[str, Any]) -> None:
        self.rng, self.caps = rng, caps

    def value(self, schema: Any, name: str | None = None, depth: int = 0) -> Any:
        rng = self.rng
        if name in self.caps:
            cap = self.caps[name]
            return cap(rng) if callable(cap) else copy.deepcopy(cap)
        if schema is True or schema == {}:
            return rng.choice([1, "x", None, True, {"k": 2}, [1, 2]])
        if "const" in schema:
            return copy.deepcopy(schema["const"])
        if "enum" in schema:
            return copy.deepcopy(rng.choice(schema["enum"]))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = [s for s in schema[key] if s != {"type": "null"}] or schema[key]
                return self.value(rng.choice(options), name, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = rng.choice(kind)
        return getattr(self, f"_{kind}")(schema, depth)

    def _null(self, schema: dict, depth: int) -> None:
        return None

    def _boolean(self, schema: dict, depth: int) -> bool:
        return self.rng.random() < 0.5

    def _integer(self, schema: dict, depth: int) -> int:
        low = schema.get("minimum", -5)
        return self.rng.randint(low, min(schema.get("maximum", low + 10), low + 10))

    def _number(self, schema: dict, depth: int) -> float:
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        high = schema.get("maximum", low + 2)
        value = round(self.rng.uniform(low, high), 3)
        return value if value > schema.get("exclusiveMinimum", float("-inf")) else high

    def _string(self, schema: dict, depth: int) -> str:
        if "pattern" in schema:
            return self.rng.choice(["get_weather", "a", "tool-1"])
        n = self.rng.randint(max(1, schema.get("minLength", 0)), 6)
        return "".join(self.rng.choice(string.ascii_lowercase + " ") for _ in range(n)).strip() or "a"

    def _array(self, schema: dict, depth: int) -> list:
        low = schema.get("minItems", 0)
        n = self.rng.randint(low, min(schema.get("maxItems", low + 2), low + 2))
        return [self.value(schema.get("items", {}), None, depth + 1) for _ in range(n)]

    def _object(self, schema: dict, depth: int) -> dict:
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        out = {}
        for key, sub in props.items():
            if key in required or key in self.caps or self.rng.random() < 0.3:
                out[key] = self.value(sub, key, depth + 1)
        return out


def mutate(body: dict, rng: random.Random) -> dict | bytes:
    """A body changed in one to three ways, most of them outside its schema (the raw bytes of
    broken JSON now and then)."""
    if rng.random() < 0.05:
        text = json.dumps(body)
        return rng.choice([text[:rng.randrange(len(text))].encode(), b"\xff\xfe", b"[1, 2]", b"{}",
                           b'{"model": NaN}', b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b"}"])
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        paths = list(walk(body))
        path, _ = rng.choice(paths)
        action = rng.random()
        if action < 0.45 and path:
            put(body, path, rng.choice(ODD_VALUES + ODD_STRINGS + [deep(rng.choice([3, 60, 500]))]))
        elif action < 0.6 and path:
            remove(body, path)
        elif action < 0.75:
            target = get(body, path)
            if isinstance(target, dict):
                target[rng.choice(["extra", "file", "__proto__", "role", "type", "é"])] = rng.choice(ODD_VALUES)
        elif action < 0.9 and path:
            value = get(body, path)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                put(body, path, rng.choice([value * 10 ** 9, -value - 1, value + 0.5, 2 ** 64, -(2 ** 64)]))
            elif isinstance(value, str):
                put(body, path, value + rng.choice(ODD_STRINGS))
            elif isinstance(value, list):
                put(body, path, value * rng.choice([0, 2, 70]))
        else:
            body[rng.choice(list(body) or ["model"])] = rng.choice(ODD_VALUES)
    return body


def walk(value: Any, path: tuple = ()) -> Any:
    yield path, value
    if len(path) >= 50:  # a body nested deeper (deep(500), put by an earlier mutation) is not walked past it
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from walk(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:5]):
            yield from walk(v, path + (i,))


def get(value: Any, path: tuple) -> Any:
    for p in path:
        value = value[p]
    return value


def put(value: Any, path: tuple, new: Any) -> None:
    get(value, path[:-1])[path[-1]] = new


def remove(value: Any, path: tuple) -> None:
    parent = get(value, path[:-1])
    if isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])


def is_valid(schema: dict, body: Any) -> bool:
    return isinstance(body, dict) and Validator(schema).is_valid(body)

"""The one way in for every route of `handformer serve`: the key, the body, the error.

Every route (the OpenAI routes in app.py, the playground's, and any route in a file of its own)
reads its request the same way:

    from handformer.serve.door import APIError, Fields, SDK_FIELDS, read_json, read_sampling

    async def my_route(request: Request) -> Any:
        f = Fields(await read_json(request, limit), {"model", "input", "temperature", "top_p"},
                   ignored=SDK_FIELDS)                    # 413, bad JSON, an unknown field: 400
        model = f.string("model", required=True)          # typed reads; each error names the field
        sampling = read_sampling(f)                       # temperature, top_p, top_k, seed: one value
        if ...:
            raise APIError(400, "max_output_tokens must be ...; send ...", "max_output_tokens")

- **The body**: `read_json` refuses a body over the limit (413, never read whole) and anything
  but a JSON object (400 `invalid_json`). `Fields(body, known, ignored=...)` refuses an unknown
  field with a 400 naming it (`speculate` and `prediction`, speculative decoding, with a 400 that
  says why); the fields in `ignored` (the official SDKs' `store`, `metadata`,
  `include`, `truncation`, `service_tier`, by default) are accepted and never read.
  `read_sampling` turns the sampling fields into one `SamplingOptions`, checked once, which the
  route hands to the engine as it is.
- **The error**: anything a route refuses is an `APIError(status, message, param, code)`. It is
  rendered in the shape of the API its path belongs to (errors.py: `ERROR_SHAPES`): OpenAI's
  `{"error": {"message", "type", "param", "code"}}`, and under `/v1/messages` Anthropic's
  `{"type": "error", "error": {"type", "message"}}`. A stream whose headers are sent reports it
  as an event instead (`error_body(status, message, ..., path=...)` gives the JSON).
- **The key**: `auth(api_key)` is a dependency for a router or a route. With a key, a request
  must send it as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
  (Anthropic's); without one (None), every request passes.

A new router joins the app in `create_app` with `app.include_router(router)`; its paths are
counted in `/metrics` by their route template and listed in the 404 of an unknown path on their own.
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Callable
from typing import Any

from fastapi import Request

from handformer.generation.sampling import SamplingOptions
from handformer.serve.errors import APIError, error_body, read_capped

# Fields the official clients send that change nothing this server does: accepted, never read.
# A route that honours one of them (the Responses API's `store`) leaves it out of its `ignored`.
SDK_FIELDS = frozenset({"include", "store", "metadata", "truncation", "service_tier"})
MAX_SEED = 2**63 - 1
SPECULATION_FIELDS = frozenset({"speculate", "prediction"})  # refused with a reason (refuse_speculation)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, refused with 413 as soon as the body passes `limit` bytes."""
    body = await read_capped(request, limit)
    if body is None:
        raise APIError(413, f"the request body is over the limit of {limit} bytes; send less",
                       code="request_too_large")
    return parse_json(body)


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
    except RecursionError:
        raise APIError(400, "the request body nests JSON too deeply; send flatter JSON",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(data).__name__}",
                       code="invalid_json")
    try:  # "\ud800" escapes parse to a lone surrogate, which is no text a tokenizer can read
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, "the request body holds a lone UTF-16 surrogate escape (such as \\ud800), "
                       "which is not a character; send valid Unicode", code="invalid_json") from None
    return data


def show(value: Any) -> str:
    """A value as an error message quotes it (JSON, cut at 60 characters)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Fields:
    """Typed reads of a request body's fields; each error names the field. `known`: the fields
    the route reads; `ignored`: fields accepted and never read; any other field is a 400."""

    def __init__(self, body: dict[str, Any], known: set[str] | frozenset[str],
                 ignored: set[str] | frozenset[str] = frozenset()) -> None:
        refuse_speculation(body)
        unknown = sorted(set(body) - set(known) - set(ignored))
        if unknown:
            raise APIError(400, f"unrecognized request argument(s): {', '.join(unknown)}; this endpoint "
                           f"takes {', '.join(sorted(known))}", unknown[0])
        self.body = body

    def fail(self, name: str, wanted: str) -> APIError:
        return APIError(400, f"{name} must be {wanted}, got {show(self.body.get(name))}", name)

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

    def number(self, name: str, default: float, ok: Callable[[float], bool], wanted: str) -> float:
        value = self.body.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not ok(value):
            raise self.fail(name, wanted)
        return float(value)

    def unsupported(self, name: str, harmless: Callable[[Any], bool]) -> None:
        """Accept `name` only when it changes nothing (`harmless(value)`)."""
        value = self.body.get(name)
        if value is not None and not harmless(value):
            raise APIError(400, f"{name}={show(value)} is not supported by this server; leave it out",
                           name)


def refuse_speculation(body: dict[str, Any]) -> None:
    """A 400 that says why for a request asking for speculative decoding (`speculate`, handformer's
    name, or `prediction`, OpenAI's predicted outputs): it checks one row's guesses in a forward of
    its own, while the server decodes every request's row in one shared forward per step."""
    asked = sorted(SPECULATION_FIELDS & set(body))
    if asked:
        raise APIError(400, f"{asked[0]}: speculative decoding is not served; it checks one row's guesses "
                       "in a forward of its own, while this server decodes every request's row in one "
                       f"shared forward per step; leave out {asked[0]}, or use `handformer generate "
                       "--speculate` or `handformer chat --speculate` for one stream", asked[0])


def read_sampling(f: Fields, *, top_logprobs: int | None = None, max_temperature: float | None = None,
                  seed_below: int = MAX_SEED) -> SamplingOptions:
    """The sampling fields (`temperature`, `top_p`, `top_k`, `seed`; each optional) as one value.
    `max_temperature`: the API's own upper bound (Anthropic's is 1); `seed_below`: room left for
    the seeds of n choices (choice i samples with seed + i)."""
    top = "" if max_temperature is None else f" and <= {max_temperature:g}"
    temperature = f.number("temperature", 1.0, lambda v: v >= 0 and (max_temperature is None
                                                                     or v <= max_temperature),
                           f"a number >= 0{top} (0 = greedy)")
    top_p = f.number("top_p", 1.0, lambda v: 0 < v <= 1, "a number in (0, 1]")
    seed = f.integer("seed", -(2 ** 63))
    if seed is not None and seed >= seed_below:
        raise f.fail("seed", f"an integer below {seed_below}")
    return SamplingOptions(temperature, f.integer("top_k", 1), None if top_p == 1 else top_p, seed,
                           top_logprobs)


def auth(api_key: str | None) -> Callable[[Request], Any]:
    """A dependency: with a key, the request must carry it as `Authorization: Bearer KEY` or as
    `x-api-key: KEY`, compared in constant time (the time taken does not tell how much of a guess
    was right). Its 401 is rendered in the shape of the path's API."""
    expected = None if api_key is None else api_key.encode("utf-8")

    async def check(request: Request) -> None:
        if expected is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else ""
        given = given or request.headers.get("x-api-key", "").strip()
        if not given:
            raise APIError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' "
                           "(or 'x-api-key: KEY')", code="invalid_api_key")
        if not hmac.compare_digest(given.encode("utf-8"), expected):
            raise APIError(401, "incorrect API key", code="invalid_api_key")

    return check


__all__ = ["SDK_FIELDS", "SPECULATION_FIELDS", "APIError", "Fields", "auth", "error_body", "parse_json",
           "read_json", "read_sampling", "refuse_speculation", "show"]

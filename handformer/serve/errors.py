"""The server's one error type, `APIError`, rendered in the shape of the API a path belongs to:

    OpenAI's (every route but those below):  {"error": {"message", "type", "param", "code"}}
    Anthropic's (/v1/messages...):           {"type": "error", "error": {"type", "message"}}

for every failure: bad input (400), a missing or wrong API key (401), an unknown model or route
(404, listing the server's routes, only to a caller with the key), a body over the size limit
(413), a server that is stopping (503), and anything unexpected (500, logged, with no traceback in
the answer).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from handformer.generation.grammar import OVER_LIMITS

log = logging.getLogger("handformer.serve")

OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 499: "invalid_request_error",
                500: "server_error", 503: "server_error"}
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 503: "overloaded_error"}


class APIError(Exception):
    """A refusal: the HTTP status, a message that says what to send instead, the request field at
    fault (`param`, OpenAI's name for it) and a machine-readable `code`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def openai_body(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": OPENAI_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def anthropic_body(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "invalid_request_error"),
                                       "message": message}}


# (path prefix, renderer): the first prefix a path starts with picks its shape; else OpenAI's.
ERROR_SHAPES = (("/v1/messages", anthropic_body),)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None, *,
               path: str = "") -> dict[str, Any]:
    """The error's JSON in the shape of `path`'s API (OpenAI's when no path is given)."""
    render = next((r for prefix, r in ERROR_SHAPES if path.startswith(prefix)), openai_body)
    return render(status, message, param, code)


def error_response(err: APIError, path: str = "") -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(error_body(err.status, err.message, err.param, err.code, path=path), err.status,
                        headers=headers)


async def read_capped(request: Request, limit: int) -> bytes | None:
    """The request's body, or None as soon as it passes `limit` bytes (it is never read whole)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def error_code(status: int, message: str) -> str:
    """The code of an error that ended a sequence (serve/engine.py: TokenSink.fail)."""
    if status >= 500:
        return "generation_failed"
    return "schema_over_limits" if message.startswith(OVER_LIMITS) else "schema_unreachable"


def route_list(app: Any) -> str:
    """Every route the app answers, as `METHOD /path` (the 404 of an unknown path lists them),
    read from its OpenAPI description, so a route added anywhere is listed; and the page at `/`."""
    paths = app.openapi()["paths"]
    listed = ["GET /"] + [f"{'/'.join(m.upper() for m in sorted(item))} {path}"
                          for path, item in paths.items()]
    return ", ".join(listed)


def add_error_handlers(app: FastAPI, door: Callable[[Request], Awaitable[None]] | None = None) -> None:
    """Every error as an APIError, in its path's shape. `door`: the key check (door.auth) that an
    unknown path or method passes before its 404 or 405, as OpenAI's server does: without the
    key a caller gets the 401, never the list of routes."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        return error_response(err, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = f"{where or 'the request'}: {first.get('msg', 'invalid')}"
        return error_response(APIError(400, message, where), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if door is not None and err.status_code in (404, 405):
            try:
                await door(request)
            except APIError as refused:
                return error_response(refused, path)
        message = {404: f"no route {path}; this server has {route_list(request.app)}",
                   405: f"{request.method} is not allowed on {path}"}.get(err.status_code, str(err.detail))
        return error_response(APIError(err.status_code, message), path)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(APIError(500, f"the server failed: {type(err).__name__}: {err}"),
                              request.url.path)


__all__ = ["ERROR_SHAPES", "APIError", "add_error_handlers", "error_body", "error_code", "error_response",
           "read_capped", "route_list"]

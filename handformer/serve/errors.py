"""Errors as OpenAI's API returns them: a status and

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}

for every failure under /v1: bad input (400), a missing or wrong API key (401), an unknown model
or route (404), a body over the size limit (413), and anything unexpected (500, with no traceback).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from handformer.generation.grammar import OVER_LIMITS

log = logging.getLogger("handformer.serve")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
               503: "server_error"}


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


class APIError(Exception):
    """An error answered as OpenAI's error JSON; `param` names the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 503: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict:
    """An error as Anthropic's API writes it (the routes under /v1/messages)."""
    kind = ANTHROPIC_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_response(err: APIError, path: str = "") -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    body = anthropic_error_body(err.status, err.message) if path.startswith("/v1/messages") else \
        error_body(err.status, err.message, err.param, err.code)
    return JSONResponse(body, err.status, headers=headers)


def add_error_handlers(app: FastAPI) -> None:
    """OpenAI-style errors for the API routes; other routes (the playground's) keep FastAPI's."""

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
        if not request.url.path.startswith("/v1"):
            return JSONResponse({"detail": err.detail}, err.status_code, headers=err.headers)
        message = {404: f"no route {request.url.path}; the API has /v1/models, /v1/completions, "
                        "/v1/chat/completions, /v1/responses, /v1/messages, "
                        "/v1/messages/count_tokens, /v1/embeddings and /v1/translations",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
            err.status_code, str(err.detail))
        return error_response(APIError(err.status_code, message), request.url.path)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(APIError(500, f"the server failed: {type(err).__name__}: {err}"))


__all__ = ["APIError", "add_error_handlers", "anthropic_error_body", "error_body", "error_code",
           "error_response"]

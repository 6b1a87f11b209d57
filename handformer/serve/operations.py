"""The routes an operator's tools call, beside the APIs:

    GET /health    200 {"status": "ok"} while every model's decoding thread runs and takes requests;
                   503 {"status": "draining"} once the server is stopping, or {"status": "failed"}
                   naming a model whose decoding thread has died. No key needed: a container
                   probe has none.
    GET /metrics   Prometheus's text format (metrics.py lists the names), behind the API key when
                   the server has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse

from handformer.serve.door import auth
from handformer.serve.engine import BatchEngine
from handformer.serve.metrics import Metrics

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class Lifecycle:
    """Whether the server is stopping (set when its shutdown begins, before the engines stop)."""

    def __init__(self) -> None:
        self.draining = False


def operations_router(engines: Mapping[str, BatchEngine], metrics: Metrics, lifecycle: Lifecycle,
                      api_key: str | None) -> APIRouter:
    router = APIRouter()

    async def health() -> JSONResponse:
        if lifecycle.draining:
            return JSONResponse({"status": "draining"}, 503)
        dead = sorted(name for name, engine in engines.items() if not engine.alive)
        if dead:
            return JSONResponse({"status": "failed", "message": f"the decoding thread of {', '.join(dead)} "
                                 "is not running; restart the server"}, 503)
        return JSONResponse({"status": "ok"})

    async def prometheus() -> Any:
        return PlainTextResponse(metrics.render(dict(engines)), media_type=PROMETHEUS_TEXT)

    router.add_api_route("/health", health, methods=["GET"])
    router.add_api_route("/metrics", prometheus, methods=["GET"], dependencies=[Depends(auth(api_key))])
    return router


__all__ = ["Lifecycle", "operations_router"]

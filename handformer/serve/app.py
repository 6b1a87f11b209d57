"""The FastAPI application: OpenAI-compatible routes over the served models.
(To be written: see issue 17, part 1.)"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI

from handformer.serve.playground import playground_router
from handformer.serve.registry import ServedModel


def create_app(models: Mapping[str, ServedModel], *, api_key: str | None = None,
               cors_origins: list[str] | None = None) -> FastAPI:
    app = FastAPI(title="handformer")
    app.state.models = dict(models)
    app.include_router(playground_router(models))
    return app

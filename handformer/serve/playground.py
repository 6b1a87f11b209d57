"""The playground page's routes: the page (`/`) and the look-ups it makes on the served models.
(To be written: see issue 17, part 2.)"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter

from handformer.serve.registry import ServedModel


def playground_router(models: Mapping[str, ServedModel]) -> APIRouter:
    """The page at `/` and its JSON routes under `/playground/`."""
    return APIRouter()

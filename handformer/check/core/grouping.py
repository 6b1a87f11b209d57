"""Grouped-query attention that a learner's file does not use. Check builds an attention whose
configuration names its key/value heads with fewer of them than query heads, so that a wrong repeat
shows. An attention that never repeats them (StableLM's, written for a config that sets as many) raises
there; where the file's own configuration gives as many key/value heads as heads, that is how the
file runs, and it is checked so (Context.ungrouped), said in the report. A file whose configuration
groups its heads, leaves them unset (Meta's n_kv_heads = None: its repeat_kv is meant to run), or
gives no configuration keeps its failure.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from handformer.check.core.discovery import ARGUMENTS
from handformer.check.core.result import text

UNGROUPED_NOTE = text(
    "built with fewer key/value heads than query heads, your attention raises (it does not repeat them), "
    "and your file's configuration gives as many key/value heads as heads: checked with as many, as your "
    "file runs",
    "键/值头比查询头少时，你的注意力会报错（它没有重复键/值头）；你文件里的配置给的键/值头和头一样多："
    "按一样多检查，和你的文件运行时一样")


def ungrouped_by_default(module: types.ModuleType) -> bool:
    """Whether every configuration class of the learner's file whose defaults name the key/value heads
    gives as many as query heads; False where none names them."""
    said = {_ungrouped(_defaults(obj)) for obj in vars(module).values() if _own_config(obj, module)}
    return said - {None} == {True}


def _own_config(obj: Any, module: types.ModuleType) -> bool:
    """A class of the file's own that is no module: a config dataclass, a Hugging Face style config."""
    return inspect.isclass(obj) and obj.__module__ == module.__name__ and not hasattr(obj, "forward")


def _defaults(config: type) -> dict[str, Any]:
    """A config class's defaults by name, as its constructor takes them (a dataclass's fields too)."""
    try:
        params = inspect.signature(config).parameters.values()
    except (TypeError, ValueError):  # a class with no signature to read
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty}


def _ungrouped(defaults: dict[str, Any]) -> bool | None:
    """Whether the key/value heads default to the heads' number; None where not named."""
    kv = [defaults[n] for n in ARGUMENTS["n_kv_heads"] if n in defaults]
    heads = [defaults[n] for n in ARGUMENTS["n_heads"] if n in defaults]
    return kv[:1] == heads[:1] if kv else None

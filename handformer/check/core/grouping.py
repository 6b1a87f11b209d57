"""Grouped-query attention that a learner's file does not use. Check builds an attention whose
configuration names its key/value heads with fewer of them than query heads, so that a wrong repeat
shows. An attention that never repeats them (StableLM's, written for a config that sets as many) raises
there; where the file's own configuration gives as many key/value heads as heads, that is how the
file runs, and it is checked so (Context.own_kv), said in the report. A file whose configuration
groups its heads, leaves them unset (Meta's n_kv_heads = None: its repeat_kv is meant to run), or
gives no configuration keeps its failure. Likewise a file whose configuration gives one key/value head
(multi-query: Falcon's fused projection split into the queries, one key and one value) is checked with
one where more raise.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import ARGUMENTS
from handformer.check.core.result import text

UNGROUPED_NOTE = text(
    "built with fewer key/value heads than query heads, your attention raises (it does not repeat them), "
    "and your file's configuration gives as many key/value heads as heads: checked with as many, as your "
    "file runs",
    "键/值头比查询头少时，你的注意力会报错（它没有重复键/值头）；你文件里的配置给的键/值头和头一样多："
    "按一样多检查，和你的文件运行时一样")


MULTI_QUERY_NOTE = text(
    "built with more than one key/value head, your attention raises, and your file's configuration gives "
    "one key/value head (multi-query attention): checked with one, as your file runs",
    "键/值头多于一个时，你的注意力会报错；你文件里的配置只给一个键/值头（多查询注意力）："
    "按一个检查，和你的文件运行时一样")


def kv_heads_by_default(module: types.ModuleType) -> str | None:
    """What every configuration class of the learner's file whose defaults name the key/value heads
    gives: "ungrouped" (as many as query heads), "one" (multi-query); None where none names them, or
    they say other numbers."""
    said = {_kv_default(_defaults(obj)) for obj in vars(module).values() if _own_config(obj, module)}
    said -= {None}
    return said.pop() if len(said) == 1 else None


def _own_config(obj: Any, module: types.ModuleType) -> bool:
    """A class of the file's own that is no module: a config dataclass, a Hugging Face style config."""
    return inspect.isclass(obj) and obj.__module__ == module.__name__ and not hasattr(obj, "forward")


def _defaults(config: type) -> dict[str, Any]:
    """A config class's defaults by name, as its constructor takes them (a dataclass's fields too)."""
    # none for a class with no signature to read
    params = quietly(lambda: inspect.signature(config).parameters.values(), (TypeError, ValueError), ())
    return {p.name: p.default for p in params if p.default is not p.empty}


def _kv_default(defaults: dict[str, Any]) -> str | None:
    """"ungrouped" where the key/value heads default to the heads' number, "one" where to one, "other"
    for any other number; None where not named."""
    kv = [defaults[n] for n in ARGUMENTS["n_kv_heads"] if n in defaults]
    heads = [defaults[n] for n in ARGUMENTS["n_heads"] if n in defaults]
    return {1: "one", **dict.fromkeys(heads[:1], "ungrouped")}.get(kv[0], "other") if kv else None

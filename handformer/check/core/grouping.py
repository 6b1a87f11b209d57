"""Grouped-query attention that a learner's file does not use. Check builds an attention whose
configuration names its key/value heads with fewer of them than query heads, so that a wrong repeat
shows. An attention that never repeats them (StableLM's, written for a config that sets as many) raises
there; where the file's own configuration gives as many key/value heads as heads (or leaves them unset:
Meta's n_kv_heads = None), that is how the file runs, and it is checked so (Context.ungrouped), said in
the report. A file whose configuration groups its heads, or that gives no configuration, keeps its
failure.
"""

from __future__ import annotations

import dataclasses
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
    """Whether every configuration of the learner's file that names the key/value heads (a config
    class's default, a dict's value) gives as many as query heads, or None; False where none names them."""
    configs = map(_settings, _own_configs(module))
    said = [_ungrouped(s) for s in configs if set(s) & set(ARGUMENTS["n_kv_heads"])]
    return bool(said) and all(said)


def _own_configs(module: types.ModuleType) -> list[Any]:
    """The file's own classes that are no module (a config dataclass, a Hugging Face style config),
    and its dicts (Raschka's cfg)."""
    return [obj for obj in vars(module).values()
            if isinstance(obj, dict) or (inspect.isclass(obj) and obj.__module__ == module.__name__
                                         and not hasattr(obj, "forward"))]


def _settings(config: Any) -> dict[str, Any]:
    """A configuration's settings by name: a dict's items; a class's defaults (a dataclass's fields,
    else its constructor's arguments), its class attributes under them."""
    if isinstance(config, dict):
        return {k: v for k, v in config.items() if isinstance(k, str)}
    own = {k: v for k, v in vars(config).items() if not k.startswith("_") and not callable(v)}
    if dataclasses.is_dataclass(config):
        fields = dataclasses.fields(config)
        return {**own, **{f.name: f.default for f in fields if f.default is not dataclasses.MISSING}}
    try:
        params = inspect.signature(config).parameters.values()
    except (TypeError, ValueError):
        return own
    return {**own, **{p.name: p.default for p in params if p.default is not p.empty}}


def _ungrouped(settings: dict[str, Any]) -> bool:
    kv = next(settings[n] for n in ARGUMENTS["n_kv_heads"] if n in settings)
    heads = next((settings[n] for n in ARGUMENTS["n_heads"] if n in settings), None)
    return kv is None or kv == heads

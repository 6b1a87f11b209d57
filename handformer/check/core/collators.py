"""A data collator's method as a runner calls it: Hugging Face's `DataCollatorForLanguageModeling.
torch_mask_tokens`, `DataCollatorForT5MLM.random_spans_noise_mask` are graded on an instance of their
class, built with the settings its constructor names (a runner's `fill` gives each by its name)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from handformer.check.core.argument_names import readable_parameters
from handformer.check.core.context import Context
from handformer.check.core.discovery import Component, DiscoveryError, cannot_fill


def as_bound(comp: Component, ctx: Context, fill: Callable[[str], Any], takes: tuple[str, str]) -> Any:
    """The component's function itself, or its method bound to an instance of its class, the
    constructor's arguments given by `fill(name)` (None: not known, left to its default)."""
    fn = comp.obj
    owner = fn.__qualname__.rpartition(".")[0]
    if not owner:
        return fn
    cls = fn.__globals__.get(owner)
    if not isinstance(cls, type):
        raise DiscoveryError(f"{comp.name}: its class {owner} is not at the top of the file; {takes[0]}",
                             zh=f"{comp.name}：它的类 {owner} 不在文件顶层；{takes[1]}")
    params = readable_parameters(cls)
    args = {p.name: fill(p.name) for p in params if fill(p.name) is not None}
    unknown = [p.name for p in params if p.default is p.empty and p.name not in args
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    cannot_fill(owner, unknown, (), [owner], "", takes)
    return getattr(ctx.learner.call("__init__", cls, **args), fn.__name__)
